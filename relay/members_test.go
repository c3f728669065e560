package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// Membership changes: relays tell each other (NOTIFY, payload "members")
// when they join, leave or hand lanes back, and the others rebalance at
// once. These tests use a heartbeat far longer than their deadlines, so
// that the heartbeat cannot be what moved the lanes.

// slowHeartbeat is e.config() with a heartbeat the tests never reach.
func (e *env) slowHeartbeat() relay.Config {
	cfg := e.config()
	cfg.LeaseTTL, cfg.Heartbeat = 10*time.Minute, 5*time.Minute
	return cfg
}

// startBalanced starts two relays of cfg and waits (at most within) until
// each holds half of the lanes, knows it (a heartbeat of its own ended at
// its share: one that counted only itself may have taken 128 of a target
// of 256, and it stays short until it hears of the other) and listens
// (its wake-up session has tried the watcher's lock: a relay's leaser may
// take its lanes before its LISTEN is up, and a notification sent before
// that is not heard); stop2 stops the second as SIGTERM does.
func (e *env) startBalanced(t *testing.T, cfg relay.Config, within time.Duration) (r1, r2 *relay.Relay, stop2 func()) {
	t.Helper()
	r1, _ = e.start(cfg, e.sink)
	r2, stop2 = e.start(cfg, e.sink)
	eventually(t, within, func() bool {
		return r1.OwnedLanes() == 128 && r2.OwnedLanes() == 128
	}, "lanes not split evenly: %d and %d", r1.OwnedLanes(), r2.OwnedLanes())
	for _, r := range []*relay.Relay{r1, r2} {
		r.AwaitSignal(t, within, relay.SigBalanced, 0, func(v int) bool { return v == 128 })
	}
	listening := func(r *relay.Relay) bool {
		return r.SignalCount(relay.SigElected)+r.SignalCount(relay.SigFollowing) > 0
	}
	eventually(t, within, func() bool { return listening(r1) && listening(r2) }, "a relay's LISTEN session is not up")
	return r1, r2, stop2
}

// ownedBy returns how many lanes each relay holds in the lanes table.
func (e *env) ownedBy(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT owner, count(*) FROM "+e.table("lanes")+
		" WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var o string
		var n int
		require.NoError(t, rows.Scan(&o, &n))
		out[o] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func TestJoiningRelayTakesItsShareWithoutWaitingForAHeartbeat(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.slowHeartbeat()
	r1, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r1.OwnedLanes() == 256 }, "first relay holds %d lanes", r1.OwnedLanes())

	// A backlog keeps r1's workers inside claims: some of the lanes it
	// hands over are in use and move when their batch ends.
	e.sink.SetDelay(5 * time.Millisecond)
	var msgs []outbox.Message
	for i := range 3000 {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%300), fmt.Sprint(i)))
	}
	e.write(msgs...)

	r2, _ := e.start(cfg, e.sink)
	r3, _ := e.start(cfg, e.sink)
	// A bound, not the subject: the handover waits for r1's batches,
	// which a loaded machine slows.
	eventually(t, testkit.LoadScaled(20*time.Second), func() bool {
		o := e.ownedBy(t)
		return len(o) == 3 && o[r1.ID()] >= 85 && o[r2.ID()] >= 85 && o[r3.ID()] >= 85
	}, "lanes not shared among three relays: %v", e.ownedBy(t))

	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), len(msgs)))
	checkOrder(t, e.sink.Delivered())
	require.Empty(t, e.sink.Violations())
}

func TestLeavingRelaysLanesAreTakenPromptly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.slowHeartbeat()
	r1, _, stop2 := e.startBalanced(t, cfg, 20*time.Second)

	e.sink.SetDelay(5 * time.Millisecond)
	var msgs []outbox.Message
	for i := range 2000 {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%200), fmt.Sprint(i)))
	}
	e.write(msgs...)
	stop2() // as SIGTERM: drains, hands its lanes back, says so
	eventually(t, 20*time.Second, func() bool {
		o := e.ownedBy(t)
		return len(o) == 1 && o[r1.ID()] == 256
	}, "the remaining relay did not take the lanes: %v", e.ownedBy(t))

	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), len(msgs)))
	checkOrder(t, e.sink.Delivered())
	require.Empty(t, e.sink.Violations())
}

// A notification that lanes were handed back ("lanes-freed") is for the
// relays below their share: a relay holding its share runs no heartbeat
// for it, as it does for "members" (the control). With sixteen relays, a
// join frees a lane at each of fifteen others, and each such
// notification made all sixteen run a heartbeat.
func TestFreedLanesWakeOnlyRelaysBelowTheirShare(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.slowHeartbeat()
	r1, r2, _ := e.startBalanced(t, cfg, 20*time.Second)
	ctx := context.Background()
	beats := func() (at map[string]time.Time) {
		rows, err := e.pool.Query(ctx, "SELECT id, heartbeat_at FROM "+e.table("relays"))
		require.NoError(t, err)
		at = map[string]time.Time{}
		for rows.Next() {
			var id string
			var ts time.Time
			require.NoError(t, rows.Scan(&id, &ts))
			at[id] = ts
		}
		require.NoError(t, rows.Err())
		return at
	}
	notify := func(payload string) {
		_, err := e.pool.Exec(ctx, "SELECT pg_notify($1, $2)", ident.Channel(e.schema), payload)
		require.NoError(t, err)
	}
	// Each relay hears the notification (or one the balancing sent) and,
	// at its share, asks for no heartbeat.
	marks := []int{r1.SignalCount(relay.SigMembersHeard), r2.SignalCount(relay.SigMembersHeard)}
	notify(store.FreedPayload)
	for i, r := range []*relay.Relay{r1, r2} {
		v := r.AwaitSignal(t, signalBound, relay.SigMembersHeard, marks[i], func(v int) bool { return v&relay.HeardFreed != 0 })
		require.Zero(t, v&relay.HeardAsked, "relay %s at its share asked for a heartbeat for freed lanes", r.ID())
	}

	before := beats()
	notify(store.MembersPayload)
	eventually(t, 5*time.Second, func() bool {
		now := beats()
		return now[r1.ID()].After(before[r1.ID()]) && now[r2.ID()].After(before[r2.ID()])
	}, "no heartbeat after a members notification: %v, was %v", beats(), before)
}

// Relays come and go while a backlog is delivered: a lane is never worked
// by two relays at once (the memory sink records any key sent
// concurrently), every message arrives, each key in order.
func TestNoLaneDoubleWorkedDuringChurn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.slowHeartbeat()
	e.sink.SetDelay(2 * time.Millisecond)
	const n = 6000
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%400), fmt.Sprint(i)))
	}
	for i := 0; i < n; i += 500 {
		e.write(msgs[i : i+500]...)
	}
	steady, _ := e.start(cfg, e.sink)
	for round := range 4 {
		a, stop := e.start(cfg, e.sink)
		b, stop2 := e.start(cfg, e.sink)
		// Stop one as soon as it took lanes (in later rounds, once the
		// other took some too), the other once it ran a heartbeat since:
		// lanes change hands while batches are in flight.
		tookLanes := func(v int) bool { return v > 0 }
		a.AwaitSignal(t, signalBound, relay.SigRebalanced, 0, tookLanes)
		if round%2 == 1 {
			b.AwaitSignal(t, signalBound, relay.SigRebalanced, 0, tookLanes)
		}
		mark := b.SignalCount(relay.SigLeaseHeld)
		stop()
		b.AwaitSignal(t, signalBound, relay.SigLeaseHeld, mark, nil)
		stop2()
	}
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 60*time.Second), n))
	require.Empty(t, e.sink.Violations())
	checkOrder(t, e.sink.Delivered())
	eventually(t, 20*time.Second, func() bool { return steady.OwnedLanes() == 256 }, "steady relay holds %d lanes", steady.OwnedLanes())
}
