package share

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a Gate's clock that the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newGate(n int) (*Gate, *clock) {
	c := &clock{t: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}
	g := New(n)
	g.now = c.now
	return g, c
}

// acquired reports whether m may start a batch now, and starts it: an
// Acquire with a context that has ended returns at once, nil only when
// it need not wait.
func acquired(t *testing.T, m *Member) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return m.Acquire(ctx) == nil
}

func TestAMemberAloneIsNotHeldBack(t *testing.T) {
	g, _ := newGate(2)
	a := g.Join(1)
	g.Join(1) // idle: never sent
	for range 10 {
		require.True(t, acquired(t, a))
	}
}

func TestActiveMembersShareTheBatchesByWeight(t *testing.T) {
	g, c := newGate(4)
	a, b := g.Join(3), g.Join(1)
	require.True(t, acquired(t, b)) // b alone: at once; now active
	for range 3 {
		require.True(t, acquired(t, a))
	}
	require.False(t, acquired(t, a), "a holds its share, 3 of 4")
	require.Equal(t, 3, a.Share())
	require.Equal(t, 1, b.Share())
	require.False(t, acquired(t, b), "b holds its share, 1 of 4")

	// A batch of a's ends: a waiter of a's goes on at once.
	done := make(chan error, 1)
	go func() { done <- a.Acquire(context.Background()) }()
	a.Release(false)
	require.NoError(t, <-done)

	// b ends its batch and starts none for ActiveFor: a is alone again.
	b.Release(false)
	require.False(t, acquired(t, a), "b ended its batch a moment ago: still active")
	c.t = c.t.Add(ActiveFor)
	require.True(t, acquired(t, a))

	// An empty batch of b's (a claim that found nothing) does not make it
	// active once it ended.
	require.True(t, acquired(t, b))
	b.Release(true)
	require.True(t, acquired(t, a))
}

func TestEveryActiveMemberHasAtLeastOneBatch(t *testing.T) {
	g, _ := newGate(2)
	ms := []*Member{g.Join(1), g.Join(1), g.Join(1), g.Join(1)}
	for _, m := range ms {
		require.True(t, acquired(t, m))
	}
	for _, m := range ms {
		require.Equal(t, 1, m.Share())
		require.False(t, acquired(t, m))
	}
}

func TestAWaitEndsWithItsContextOrWhenAMemberLeaves(t *testing.T) {
	g, _ := newGate(2)
	a, b := g.Join(1), g.Join(1)
	require.True(t, acquired(t, a))
	require.True(t, acquired(t, b))

	ctx, cancel := context.WithCancel(context.Background())
	wait := make(chan error, 1)
	go func() { wait <- a.Acquire(ctx) }()
	cancel()
	require.ErrorIs(t, <-wait, context.Canceled)

	done := make(chan error, 1)
	go func() { done <- a.Acquire(context.Background()) }()
	b.Leave()
	require.NoError(t, <-done)
}

// A member's waits for its share add up (Waited: the sources' metric),
// on the Gate's clock; a wait that its context ends counts too.
func TestWaitsForTheShareAddUp(t *testing.T) {
	g := New(2)
	var now atomic.Int64
	start := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	g.now = func() time.Time { return start.Add(time.Duration(now.Load())) }
	a, b := g.Join(1), g.Join(1)
	require.True(t, acquired(t, b))
	require.True(t, acquired(t, a))
	require.Zero(t, a.Waited(), "no wait yet")

	waiting := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return a.waiting > 0
	}
	done := make(chan error, 1)
	go func() { done <- a.Acquire(context.Background()) }()
	require.Eventually(t, waiting, 5*time.Second, time.Millisecond)
	now.Add(int64(3 * time.Second))
	a.Release(false)
	require.NoError(t, <-done)
	require.Equal(t, 3*time.Second, a.Waited())

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- a.Acquire(ctx) }()
	require.Eventually(t, waiting, 5*time.Second, time.Millisecond)
	now.Add(int64(2 * time.Second))
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, 5*time.Second, a.Waited())
	require.Zero(t, b.Waited())
}
