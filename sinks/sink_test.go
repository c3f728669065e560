package sinks_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, sinks.Permanent(nil))
	base := errors.New("too large")
	p := sinks.Permanent(base)
	require.True(t, sinks.IsPermanent(p))
	require.ErrorIs(t, p, base)
	require.Same(t, p, sinks.Permanent(p), "wrapping twice must not nest")
	require.True(t, sinks.IsPermanent(fmt.Errorf("outbox: x: %w", p)), "found through %%w")
	require.False(t, sinks.IsPermanent(base))
	require.False(t, sinks.IsPermanent(nil))
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	_, ok := sinks.RetryAfter(errors.New("x"))
	require.False(t, ok)
	err := fmt.Errorf("wrapped: %w", &sinks.RetryAfterError{Err: errors.New("429"), After: 3 * time.Second})
	d, ok := sinks.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, d)
	require.False(t, sinks.IsPermanent(err))
}

func TestBatchErrorAndOutcome(t *testing.T) {
	t.Parallel()
	be := sinks.NewBatchError(3)
	require.NoError(t, be.Err(), "no failures")
	var nilBE *sinks.BatchError
	require.NoError(t, nilBE.Err())

	perm := sinks.Permanent(errors.New("poison"))
	be.Errs[1] = sinks.ErrNotAttempted
	be.Errs[2] = perm
	err := be.Err()
	require.Error(t, err)
	require.Equal(t, 2, be.Failed())
	// The message names the real failure, not the knock-on ErrNotAttempted.
	require.Equal(t, "outbox: 2 of 3 messages failed: permanent: poison", err.Error())

	require.NoError(t, sinks.Outcome(err, 0, 3))
	require.ErrorIs(t, sinks.Outcome(err, 1, 3), sinks.ErrNotAttempted)
	require.True(t, sinks.IsPermanent(sinks.Outcome(fmt.Errorf("wrapped: %w", err), 2, 3)))
	// A whole-call error, or a BatchError of the wrong size, applies to all.
	whole := errors.New("connection refused")
	require.Same(t, whole, sinks.Outcome(whole, 2, 3))
	require.Same(t, err, sinks.Outcome(err, 0, 4))
	require.NoError(t, sinks.Outcome(nil, 0, 1))

	only := sinks.NewBatchError(1)
	only.Errs[0] = sinks.ErrNotAttempted
	require.Contains(t, only.Error(), "not attempted", "falls back to ErrNotAttempted when nothing else failed")
}

func TestKeyGate(t *testing.T) {
	t.Parallel()
	var g sinks.KeyGate
	a1 := sinks.Message{Key: "a"}
	require.False(t, g.Blocked(a1))
	g.Fail(a1)
	require.True(t, g.Blocked(sinks.Message{Key: "a"}))
	require.False(t, g.Blocked(sinks.Message{Key: "b"}), "only the failed key is held back")
	g.Fail(sinks.Message{})
	require.False(t, g.Blocked(sinks.Message{}), "messages without a key are never ordered, so never blocked")
}
