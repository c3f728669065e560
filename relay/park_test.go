package relay_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
)

// batchLog records the batches a relay reports settled.
type batchLog struct {
	relay.NopHooks
	mu     sync.Mutex
	events []relay.BatchEvent
}

func (b *batchLog) Batch(ev relay.BatchEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, ev)
}

func (b *batchLog) delivered() (n int, allCommitted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	allCommitted = true
	for _, ev := range b.events {
		n += ev.Delivered
		allCommitted = allCommitted && ev.Committed
	}
	return n, allCommitted
}

// A batch delivered at a trickle waits for the worker's next claim to
// carry its settlement; with no next message it is settled alone all the
// same, and reported once settled.
func TestTrickleBatchSettlesWithoutANextClaim(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	cfg.Workers = 1
	cfg.PollInterval = time.Minute // no safety poll's claim to carry it
	hooks := &batchLog{}
	cfg.Hooks = hooks
	e.start(cfg, e.sink)
	e.write(msg("t", "k", "1"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), 1))
	eventually(t, signalBound, func() bool { return e.count("messages") == 0 }, "the delivered message settled")
	eventually(t, signalBound, func() bool { n, _ := hooks.delivered(); return n == 1 }, "the batch reported")
	_, committed := hooks.delivered()
	require.True(t, committed)
}

// A relay stopped while a delivered batch waits for its settlement
// settles it before it stops: a graceful stop delivers nothing twice.
func TestStopSettlesTheWaitingBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	cfg.Workers = 1
	cfg.PollInterval = time.Minute
	_, stop := e.start(cfg, e.sink)
	e.write(msg("t", "k", "1"), msg("t", "k", "2"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), 2))
	stop()
	require.Zero(t, e.count("messages"), "settled before the relay stopped")

	_, stop2 := e.start(cfg, e.sink)
	defer stop2()
	e.write(msg("t", "k", "3"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), 3))
	require.Equal(t, 3, e.sink.Len(), "nothing delivered twice")
}

// Messages that come faster than the settlement's wait, one batch each,
// are all delivered in key order and all settled: each batch's
// settlement rides with the next claim.
func TestSettlementsRideWithTheNextClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	cfg.Workers = 1
	hooks := &batchLog{}
	cfg.Hooks = hooks
	e.start(cfg, e.sink)
	const n = 20
	for i := range n {
		e.write(msg("t", "k", string(rune('a'+i))))
		require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), i+1))
	}
	eventually(t, signalBound, func() bool { return e.count("messages") == 0 }, "every message settled")
	eventually(t, signalBound, func() bool { d, _ := hooks.delivered(); return d == n }, "every batch reported")
	_, committed := hooks.delivered()
	require.True(t, committed)
	for i, m := range e.sink.Delivered() {
		require.Equal(t, string(rune('a'+i)), string(m.Payload), "key order")
	}
}
