package relay_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
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

// lingering is the configuration of a relay of one worker whose
// delivered batches wait up to a minute for the next claim (only the
// next claim or the stop settles them), with the batches it reports.
func lingering(e *env) (relay.Config, *batchLog) {
	cfg := relay.WithSettleLinger(e.config(), time.Minute)
	cfg.Workers = 1
	hooks := &batchLog{}
	cfg.Hooks = hooks
	return cfg, hooks
}

// At a trickle each batch is a message or a few, and its settlement was
// a DELETE of its own: the worker's next claim now deletes the batch
// before it in the claim's own statement, in the same transaction, which
// ends once its oldest delivered batch has waited long enough (here a
// minute: only the stop ends it). Nothing is delivered twice, every
// batch is reported once committed, and the key's order holds.
func TestClaimsSettleTheBatchBeforeThem(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, hooks := lingering(e)
	r, stop := e.start(cfg, e.sink)
	const n = 10
	for i := range n {
		e.write(msg("t", "k", string(rune('a'+i))))
		require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), i+1))
	}
	chained := r.SignalCount(relay.SigChained)
	require.GreaterOrEqual(t, chained, 1, "claims that settled the batch before them")
	d, _ := hooks.delivered()
	require.Less(t, d, n, "the batches riding in the open transaction are not reported before it commits")
	stop()
	require.Zero(t, e.count("messages"), "the stop commits the transaction and its deletes")
	d, committed := hooks.delivered()
	require.Equal(t, n, d, "every batch reported once")
	require.True(t, committed)
	require.Len(t, e.sink.Delivered(), n, "nothing delivered twice")
	for i, m := range e.sink.Delivered() {
		require.Equal(t, string(rune('a'+i)), string(m.Payload), "key order")
	}
	t.Logf("%d messages one at a time: %d claims settled the batch before them", n, chained)
}

// A batch whose destination turns out down goes back untouched, its
// transaction rolled back, but the batches that rode in that transaction
// were delivered: it commits for them instead, and they are not
// delivered again.
func TestADownDestinationKeepsTheSettlementsRidingWithIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, hooks := lingering(e)
	r, stop := e.start(cfg, e.sink)
	defer stop()
	for i, p := range []string{"a", "b"} {
		e.write(msg("t", "k"+p, p))
		require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), i+1))
	}
	var down atomic.Bool
	down.Store(true)
	e.sink.SetFail(func(m sinks.Message) error {
		if down.Load() {
			return sinks.NotSent(errors.New("connection refused"))
		}
		return nil
	})
	chained, opened := r.SignalCount(relay.SigChained), r.SignalCount(relay.SigOutage)
	e.write(msg("t", "kc", "c"), msg("t", "kd", "d"))
	r.AwaitSignal(t, signalBound, relay.SigOutage, opened, func(v int) bool { return v == 1 })
	require.Greater(t, r.SignalCount(relay.SigChained), chained, "the failed batch's claim settled the one before it")
	require.Equal(t, 2, e.count("messages"), "the delivered batches left the outbox; the failed one is back")
	d, committed := hooks.delivered()
	require.Equal(t, 2, d)
	require.True(t, committed)
	down.Store(false)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 4))
	stop()
	require.Len(t, e.sink.Delivered(), 4, "nothing delivered twice")
}

// A claim that goes on in an earlier claim's transaction judges which
// rows are due by its own clock, not the transaction's: a retry that
// came due after that transaction began, and whose lane the watcher
// woke, is claimed then (with the transaction's clock it waited for the
// safety poll, an hour here).
func TestAChainedClaimSeesTheRetriesThatCameDue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, _ := lingering(e)
	cfg.PollInterval = time.Hour
	cfg.RetryInitial, cfg.RetryMax, cfg.RetryJitter = time.Second, time.Second, -1
	var refused atomic.Bool
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "retried" && refused.CompareAndSwap(false, true) {
			return errors.New("refused once")
		}
		return nil
	})
	r, _ := e.start(cfg, e.sink)
	e.write(msg("t", "kr", "retried"))
	eventually(t, signalBound, refused.Load, "the first attempt")
	// Delivered while the retry waits: its transaction stays open (the
	// linger is a minute) and the retry's claim goes on in it.
	chained := r.SignalCount(relay.SigChained)
	e.write(msg("t", "ko", "other"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), 1))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, signalBound), 2), "the retry delivered when it came due")
	require.Greater(t, r.SignalCount(relay.SigChained), chained, "the retry's claim went on in the open transaction")
}
