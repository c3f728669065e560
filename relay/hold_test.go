package relay_test

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Issue 18: the hold policy. A key whose message is dead-lettered waits,
// in order, for an operator.

// sameLane returns a key other than key whose messages share its lane.
func sameLane(key string) string {
	lane := md5.Sum([]byte(key))[0]
	for i := 0; ; i++ {
		k := fmt.Sprintf("probe-%d", i)
		if md5.Sum([]byte(k))[0] == lane {
			return k
		}
	}
}

// payloads are the payloads delivered for key, in order (first deliveries).
func payloads(delivered []sinks.Message, key string) []string {
	var out []string
	seen := map[int64]bool{}
	for _, m := range delivered {
		if m.Key == key && !seen[m.Seq] {
			seen[m.Seq] = true
			out = append(out, string(m.Payload))
		}
	}
	return out
}

// holdSetup writes messages 1..5 of key "agg" (3 rejected permanently
// while poison is on), other keys, and a keyless poison message, runs
// relays relays with the hold policy, and waits until 3 is dead and the
// lane of "agg" has been claimed after it (a later message of another key
// in that lane is delivered): 4 and 5 were passed over.
func holdSetup(t *testing.T, relays int) (e *env, poison *atomic.Bool, sink *memory.Sink, stops []func(), cfg relay.Config) {
	e = setup(t)
	poison = &atomic.Bool{}
	poison.Store(true)
	sink = memory.New()
	sink.SetFail(func(m sinks.Message) error {
		if poison.Load() && m.Key == "agg" && string(m.Payload) == "3" || string(m.Payload) == "keyless-poison" {
			return sinks.Permanent(errors.New("rejected"))
		}
		return nil
	})
	var msgs []outbox.Message
	for i := 1; i <= 5; i++ {
		msgs = append(msgs, msg("orders", "agg", fmt.Sprint(i)))
		msgs = append(msgs, msg("orders", fmt.Sprintf("other-%d", i), fmt.Sprint(i)))
	}
	msgs = append(msgs, msg("orders", "", "keyless-poison"), msg("orders", "", "keyless-ok"))
	e.write(msgs...)
	cfg = e.config()
	cfg.OnDeadLetter = relay.OnDeadLetterHold
	// Only wake-ups move the relays: the replay or purge that releases a
	// key must wake them itself (the un-parked row is no new row).
	cfg.PollInterval = time.Hour
	for range relays {
		_, stop := e.start(cfg, sink)
		stops = append(stops, stop)
	}
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 2 }, "3 and the keyless poison not dead-lettered")
	neighbour := sameLane("agg")
	e.write(msg("orders", neighbour, "after"))
	eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), neighbour)) == 1 }, "the lane of agg is not claimed any more")
	require.Equal(t, []string{"1", "2"}, payloads(sink.Delivered(), "agg"), "4 and 5 are held behind the dead letter 3")
	// The other keys flow. Relays started together may still be moving
	// lanes between them: a key's lane can be in a handover when agg's
	// neighbour arrives, so wait for them rather than assume they came first.
	for i := 1; i <= 5; i++ {
		key := fmt.Sprintf("other-%d", i)
		eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), key)) == 1 }, "other keys flow: %s", key)
		require.Equal(t, []string{fmt.Sprint(i)}, payloads(sink.Delivered(), key))
	}
	eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), "")) == 1 }, "a keyless dead letter holds nothing")
	require.Equal(t, []string{"keyless-ok"}, payloads(sink.Delivered(), ""))
	require.Equal(t, []string{"1", "2"}, payloads(sink.Delivered(), "agg"), "4 and 5 are still held")
	return e, poison, sink, stops, cfg
}

// checkHeld asserts that status and the dead-letter list show one held key,
// "agg", held by the dead letter of message 3 with 4 and 5 behind it.
func checkHeld(t *testing.T, e *env) operator.DeadLetter {
	t.Helper()
	// The sink saw the last delivery before its row was deleted.
	eventually(t, 5*time.Second, func() bool { return e.count("messages") == 3 }, "not only 3 (parked), 4 and 5 left")
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st.Held, 1)
	require.Equal(t, "", st.Held[0].Route)
	require.EqualValues(t, 1, st.Held[0].Keys)
	require.Len(t, st.Holds, 1)
	require.Equal(t, "agg", st.Holds[0].Key)
	require.EqualValues(t, 2, st.Holds[0].Behind)
	require.EqualValues(t, 2, st.Pending, "4 and 5 are pending; the parked dead letter is not")
	require.Zero(t, st.Retrying)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	var held operator.DeadLetter
	for _, d := range dls {
		if d.Key != nil && *d.Key == "agg" {
			held = d
		} else {
			require.False(t, d.Holds, "the keyless dead letter holds nothing")
		}
	}
	require.True(t, held.Holds)
	require.EqualValues(t, 2, held.Behind)
	require.Equal(t, "3", string(held.Payload))
	require.Equal(t, st.Holds[0].ID, held.ID)
	return held
}

func TestHoldThenReplayDeliversTheDeadLetterFirst(t *testing.T) {
	t.Parallel()
	for _, relays := range []int{1, 4} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			t.Parallel()
			e, poison, sink, stops, cfg := holdSetup(t, relays)
			// The hold survives the relays: kill them all, start new ones.
			for _, stop := range stops {
				stop()
			}
			for range relays {
				e.start(cfg, sink)
			}
			neighbour := sameLane("agg")
			e.write(msg("orders", neighbour, "after-restart"))
			eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), neighbour)) == 2 }, "lane not claimed after the restart")
			require.Equal(t, []string{"1", "2"}, payloads(sink.Delivered(), "agg"), "still held after a restart")
			held := checkHeld(t, e)

			poison.Store(false)
			admin, _ := operator.New(e.pool, e.schema)
			res, err := admin.Replay(context.Background(), operator.Selection{IDs: []int64{held.ID}}, operator.ReplayOptions{})
			require.NoError(t, err)
			require.Equal(t, []int64{held.ID}, res.IDs(operator.Replayed))
			eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), "agg")) == 5 }, "the key did not resume")
			require.Equal(t, []string{"1", "2", "3", "4", "5"}, payloads(sink.Delivered(), "agg"))
			for _, m := range sink.Delivered() {
				if m.Key == "agg" && string(m.Payload) == "3" {
					require.Equal(t, held.MessageID, m.ID, "the replay keeps the message id")
					require.Equal(t, held.ID, m.Seq, "and the original id")
				}
			}
			checkOrder(t, sink.Delivered())
			require.Empty(t, sink.Violations())
			st, err := admin.Status(context.Background())
			require.NoError(t, err)
			require.Empty(t, st.Held)
		})
	}
}

func TestHoldThenPurgeReleasesTheKey(t *testing.T) {
	t.Parallel()
	e, _, sink, _, _ := holdSetup(t, 1)
	held := checkHeld(t, e)
	admin, _ := operator.New(e.pool, e.schema)
	res, err := admin.PurgeHolds(context.Background(), operator.Selection{IDs: []int64{held.ID}}, false)
	require.NoError(t, err)
	require.Equal(t, operator.PurgeResult{Purged: 1, ReleasedKeys: 1}, res)
	eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), "agg")) == 4 }, "the key was not released")
	require.Equal(t, []string{"1", "2", "4", "5"}, payloads(sink.Delivered(), "agg"))
	eventually(t, 5*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not empty")
}

// Two dead letters of one key replay in id order, whichever is replayed
// first: the older one still holds the key.
func TestHoldTwoDeadLettersOfAKeyReplayInIDOrder(t *testing.T) {
	t.Parallel()
	e, poison, sink, _, _ := holdSetup(t, 1)
	held := checkHeld(t, e)
	admin, _ := operator.New(e.pool, e.schema)
	// Purge-free path to a second dead letter: replay 3, which dies again,
	// and 4 with it.
	sink.SetFail(func(m sinks.Message) error {
		if m.Key == "agg" && (string(m.Payload) == "3" || string(m.Payload) == "4") && poison.Load() {
			return sinks.Permanent(errors.New("rejected"))
		}
		return nil
	})
	_, err := admin.Replay(context.Background(), operator.Selection{IDs: []int64{held.ID}}, operator.ReplayOptions{})
	require.NoError(t, err)
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 2 }, "3 did not die again")
	// 3 died again and holds 4 and 5 (4 never went: it is behind 3).
	e.write(msg("orders", "agg", "6"))
	var four int64
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT id FROM "+e.table("messages")+" WHERE key = 'agg' AND payload = '4'").Scan(&four))
	// Park 4 by hand as a second hold of the key: replaying it alone must
	// not let it overtake 3.
	_, err = e.pool.Exec(context.Background(), `WITH p AS (UPDATE `+e.table("messages")+` SET available_at = 'infinity', held_since = now(), held_route = ''
		WHERE id = $1 RETURNING *)
		INSERT INTO `+e.table("dead_letters")+` (id, message_id, topic, key, payload, headers, created_at, attempts, reason)
		SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent' FROM p`, four)
	require.NoError(t, err)
	poison.Store(false)
	_, err = admin.Replay(context.Background(), operator.Selection{IDs: []int64{four}}, operator.ReplayOptions{})
	require.NoError(t, err)
	neighbour := sameLane("agg")
	e.write(msg("orders", neighbour, "after-replay-4"))
	eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), neighbour)) == 2 }, "lane not claimed")
	require.Equal(t, []string{"1", "2"}, payloads(sink.Delivered(), "agg"), "4 waits for 3")
	_, err = admin.Replay(context.Background(), operator.Selection{IDs: []int64{held.ID}}, operator.ReplayOptions{})
	require.NoError(t, err)
	eventually(t, 20*time.Second, func() bool { return len(payloads(sink.Delivered(), "agg")) == 6 }, "the key did not resume")
	require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, payloads(sink.Delivered(), "agg"))
}

// With the default policy the key moves on (today's behaviour).
func TestSkipPolicyLetsTheKeyMoveOn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "3" {
			return sinks.Permanent(errors.New("rejected"))
		}
		return nil
	})
	for i := 1; i <= 5; i++ {
		e.write(msg("orders", "agg", fmt.Sprint(i)))
	}
	e.start(e.config(), e.sink)
	eventually(t, 20*time.Second, func() bool { return len(payloads(e.sink.Delivered(), "agg")) == 4 }, "the key did not move on")
	require.Equal(t, []string{"1", "2", "4", "5"}, payloads(e.sink.Delivered(), "agg"))
}

// A fan-out destination with hold holds its own copy of the key only: the
// other destination (skip) gets everything at once; the holding one gets
// the dead letter first after the replay, then the rest.
func TestHoldFanOutHoldsPerDestination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, hcfg := e.fanOutConfigs()
	hcfg.OnDeadLetter = relay.OnDeadLetterHold
	for i := 1; i <= 5; i++ {
		e.write(msg("orders.created", "agg", fmt.Sprint(i)))
	}
	ksink, hsink := memory.New(), memory.New()
	var poison atomic.Bool
	poison.Store(true)
	hsink.SetFail(func(m sinks.Message) error {
		if poison.Load() && string(m.Payload) == "3" {
			return sinks.Permanent(errors.New("422 unprocessable"))
		}
		return nil
	})
	e.start(router, nil)
	e.start(kcfg, ksink)
	e.start(hcfg, hsink)
	require.NoError(t, ksink.WaitFor(waitCtx(t, 20*time.Second), 5), "the other destination is not held")
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 1 }, "no dead letter")
	admin, _ := operator.New(e.pool, e.schema)
	var st operator.Status
	eventually(t, 10*time.Second, func() bool {
		var err error
		st, err = admin.Status(context.Background())
		require.NoError(t, err)
		return len(st.Holds) == 1 && st.Holds[0].Behind == 2
	}, "status does not show the held copy")
	require.Equal(t, "hook", st.Holds[0].Route)
	require.Equal(t, []operator.HeldStatus{{Route: "hook", Keys: 1, OldestAge: st.Held[0].OldestAge}}, st.Held)
	require.Equal(t, []string{"1", "2"}, payloads(hsink.Delivered(), "agg"))

	poison.Store(false)
	_, err := admin.Replay(context.Background(), operator.Selection{Route: "hook"}, operator.ReplayOptions{})
	require.NoError(t, err)
	eventually(t, 20*time.Second, func() bool { return len(payloads(hsink.Delivered(), "agg")) == 5 }, "the held copy did not resume")
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, payloads(hsink.Delivered(), "agg"))
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, payloads(ksink.Delivered(), "agg"), "delivered once to the other destination")
}
