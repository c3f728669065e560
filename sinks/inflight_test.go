package sinks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	one := []sinks.Message{{ID: "a"}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		msgs    []sinks.Message
		closed  bool
		wantErr error  // errors.Is
		wantMsg string // exact error text, when set
		called  bool
	}{
		{name: "sends", ctx: context.Background(), msgs: one, wantErr: boom, called: true},
		{name: "empty batch", ctx: context.Background(), msgs: nil},
		{name: "empty batch, ctx ended", ctx: cancelled, msgs: nil},
		{name: "ctx ended", ctx: cancelled, msgs: one, wantErr: context.Canceled, wantMsg: "outbox: test: context canceled"},
		{name: "closed", ctx: context.Background(), msgs: one, closed: true, wantErr: sinks.ErrClosed},
		{name: "closed, empty batch", ctx: context.Background(), closed: true, wantErr: sinks.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var f sinks.Inflight
			if tc.closed {
				require.NoError(t, f.Close(context.Background()))
			}
			called := false
			err := f.Guard(tc.ctx, tc.msgs, "outbox: test", func(ctx context.Context, msgs []sinks.Message) error {
				called = true
				require.Equal(t, tc.msgs, msgs)
				return boom
			})
			require.Equal(t, tc.called, called)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			if tc.wantMsg != "" {
				require.EqualError(t, err, tc.wantMsg)
			}
		})
	}
}

// TestGuardCountsInFlight checks that Close waits for a guarded send and
// that a Send after Close is refused.
func TestGuardCountsInFlight(t *testing.T) {
	t.Parallel()
	var f sinks.Inflight
	entered, release := make(chan struct{}), make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		sent <- f.Guard(context.Background(), []sinks.Message{{}}, "outbox: test", func(context.Context, []sinks.Message) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	ended, stop := context.WithCancel(context.Background())
	stop()
	require.ErrorIs(t, f.Close(ended), context.Canceled, "Close must wait for the send in flight")
	close(release)
	require.NoError(t, <-sent)
	require.NoError(t, f.Close(context.Background()))
	require.ErrorIs(t, f.Guard(context.Background(), []sinks.Message{{}}, "outbox: test", nil), sinks.ErrClosed)
}

func TestSendContext(t *testing.T) {
	t.Parallel()
	far := time.Now().Add(time.Hour)
	withDeadline, cancel := context.WithDeadline(context.Background(), far)
	defer cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		// want is the deadline expected, as an offset from now (0: ctx's own).
		want time.Duration
	}{
		{name: "own timeout, no caller deadline", ctx: context.Background(), timeout: time.Minute, want: time.Minute},
		{name: "own timeout inside the caller's", ctx: withDeadline, timeout: time.Minute, want: time.Minute},
		{name: "caller's deadline alone", ctx: withDeadline, timeout: 0},
		{name: "no deadline at all", ctx: context.Background(), timeout: 0, want: sinks.DefaultSendTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := time.Now()
			ctx, cancel := sinks.SendContext(tc.ctx, tc.timeout)
			defer cancel()
			after := time.Now()
			got, ok := ctx.Deadline()
			require.True(t, ok, "a Send always has a deadline")
			if tc.want == 0 {
				require.Equal(t, far, got)
				return
			}
			require.False(t, got.Before(before.Add(tc.want)) || got.After(after.Add(tc.want)), "deadline %s not within [%s, %s]", got, before.Add(tc.want), after.Add(tc.want))
		})
	}
	ctx, cancel := sinks.SendContext(withDeadline, 2*time.Hour)
	defer cancel()
	got, _ := ctx.Deadline()
	require.Equal(t, far, got, "the caller's earlier deadline wins")
}

// TestGuardTimed checks the publish-timeout story every sink with a
// publish_timeout shares: the sink's own timeout, when set, bounds the
// Send inside the caller's deadline; unset, the caller's deadline alone.
func TestGuardTimed(t *testing.T) {
	t.Parallel()
	relay := time.Now().Add(time.Hour) // the relay's --publish-timeout
	ctx, cancel := context.WithDeadline(context.Background(), relay)
	defer cancel()
	deadline := func(timeout time.Duration) time.Time {
		var got time.Time
		var f sinks.Inflight
		require.NoError(t, f.GuardTimed(ctx, []sinks.Message{{}}, "outbox: test", timeout, func(ctx context.Context, _ []sinks.Message) error {
			got, _ = ctx.Deadline()
			return nil
		}))
		return got
	}
	require.Equal(t, relay, deadline(0), "unset: the relay's deadline alone")
	require.True(t, deadline(time.Minute).Before(relay), "set and shorter: the sink's own")
	require.Equal(t, relay, deadline(2*time.Hour), "set and longer: the relay's deadline still ends the Send")
}
