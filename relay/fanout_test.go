package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
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

// fanOutConfigs returns a router copying orders.* to routes "kafka" and
// "hook", and the two destination relays' configurations.
func (e *env) fanOutConfigs() (router, kafka, hook relay.Config) {
	router = e.config()
	router.Route = "~fanout"
	router.Topics = []string{"orders.*"}
	router = relay.WithFanOut(router,
		relay.Destination{Route: "kafka", Topics: []string{"orders.*"}},
		relay.Destination{Route: "hook", Topics: []string{"orders.*"}},
	)
	kafka, hook = relay.WithDeliveries(e.config()), relay.WithDeliveries(e.config())
	kafka.Route, hook.Route = "kafka", "hook"
	return router, kafka, hook
}

func TestFanOutDeliversToEachDestinationIndependently(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, hcfg := e.fanOutConfigs()
	hcfg.MaxAttempts = 1000 // o7 waits for as long as Kafka takes, however slow the machine
	direct := e.config()
	direct.Route, direct.Topics = "users", []string{"users.*"}

	var msgs []outbox.Message
	for i := 0; i < 300; i++ {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("o%d", i%10), fmt.Sprintf("o%d-%d", i%10, i)))
	}
	msgs = append(msgs, msg("orders.created", "o3", "poison"))
	for i := 0; i < 50; i++ {
		msgs = append(msgs, msg("users.updated", fmt.Sprintf("u%d", i%5), fmt.Sprintf("u%d", i)))
	}
	e.write(msgs...)

	ksink, hsink, usink := memory.New(), memory.New(), memory.New()
	// The webhook refuses one message for good and is down for key o7
	// for a while: neither touches the Kafka route.
	var o7Down atomic.Bool
	o7Down.Store(true)
	hsink.SetFail(func(m sinks.Message) error {
		switch {
		case string(m.Payload) == "poison":
			return sinks.Permanent(errors.New("422 unprocessable"))
		case m.Key == "o7" && o7Down.Load():
			return errors.New("503 unavailable")
		}
		return nil
	})
	e.start(router, nil)
	rk, _ := e.start(kcfg, ksink)
	e.start(hcfg, hsink)
	e.start(direct, usink)

	require.NoError(t, ksink.WaitFor(waitCtx(t, 20*time.Second), 301), "kafka gets every orders message")
	require.NoError(t, usink.WaitFor(waitCtx(t, 20*time.Second), 50), "the direct route is not affected")
	eventually(t, 20*time.Second, func() bool { return hsink.Len() == 270 }, "hook got %d of the 270 messages not of key o7", hsink.Len())
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	var st operator.Status
	eventually(t, 10*time.Second, func() bool {
		st, err = admin.Status(context.Background())
		require.NoError(t, err)
		// Delivered is counted when the sink accepts, before the batch's
		// rows are deleted: wait for every other route's last settle too.
		return len(st.FanOut) == 1 && st.FanOut[0].Pending == 30 && st.FanOut[0].DeadLetters == 1 && st.Pending == 30
	}, "status: key o7's 30 copies waiting for the hook, the poison dead, nothing else pending")
	require.Equal(t, "hook", st.FanOut[0].Route)
	require.EqualValues(t, 30, st.Pending)
	require.Positive(t, st.FanOut[0].Retrying)
	o7Down.Store(false)
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 1 && hsink.Len() == 300 },
		"hook: %d delivered, %d dead", hsink.Len(), e.count("dead_letters"))
	eventually(t, 10*time.Second, func() bool { return e.count("messages")+e.count("deliveries") == 0 }, "pending rows left")

	kgot, hgot := ksink.Delivered(), hsink.Delivered()
	checkOrder(t, kgot)
	checkOrder(t, hgot)
	for _, m := range usink.Delivered() {
		require.Equal(t, "users.updated", m.Topic)
	}
	// The copies are the same message: same write position and id.
	ids := map[int64]string{}
	for _, m := range kgot {
		ids[m.Seq] = m.ID
	}
	for _, m := range hgot {
		require.Equal(t, ids[m.Seq], m.ID, "copy of %d has another message id", m.Seq)
	}

	dead, err := admin.List(context.Background(), operator.Selection{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "hook", dead[0].Route, "the dead letter names the destination that failed")
	require.Equal(t, "poison", string(dead[0].Payload))

	// Replay goes to the failed destination only.
	hsink.SetFail(nil)
	replayed, err := admin.Replay(context.Background(), operator.Selection{Route: "hook"}, operator.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{dead[0].ID}, replayed.IDs(operator.Replayed))
	require.NoError(t, hsink.WaitFor(waitCtx(t, 10*time.Second), 301))
	require.Equal(t, "poison", string(hsink.Delivered()[300].Payload))
	claimedAgain(t, rk, 4)
	require.Equal(t, 301, ksink.Len(), "kafka did not get the replayed message again")
}

func TestFanOutCopiesAtomicallyAndKeepsDelays(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, hcfg := e.fanOutConfigs()
	router = relay.WithFanOut(router, append(relay.FanOutOf(router), relay.Destination{Route: "audit", Topics: []string{"orders.paid"}})...)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.w.Write(ctx, tx,
		outbox.Message{Topic: "orders.paid", Key: "a", Payload: []byte("a1-delayed"), DeliverAfter: time.Hour},
		msg("orders.paid", "a", "a2"),
		msg("orders.created", "b", "b1"),
	))
	require.NoError(t, tx.Commit(ctx))
	ksink, hsink, asink := memory.New(), memory.New(), memory.New()
	acfg := relay.WithDeliveries(e.config())
	acfg.Route = "audit"
	e.start(router, nil)
	e.start(kcfg, ksink)
	e.start(hcfg, hsink)
	e.start(acfg, asink)
	// b1 goes out while key a waits for its delay (an hour); then the
	// delay is cut short.
	require.NoError(t, ksink.WaitFor(waitCtx(t, 10*time.Second), 1))
	require.NoError(t, hsink.WaitFor(waitCtx(t, 10*time.Second), 1))
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table("messages")+" SET available_at = now() WHERE available_at IS NOT NULL")
	require.NoError(t, err)
	require.NoError(t, ksink.WaitFor(waitCtx(t, 10*time.Second), 3))
	require.NoError(t, hsink.WaitFor(waitCtx(t, 10*time.Second), 3))
	require.NoError(t, asink.WaitFor(waitCtx(t, 10*time.Second), 2))
	for _, s := range []*memory.Sink{ksink, hsink} {
		got := s.Delivered()
		require.Equal(t, "b1", string(got[0].Payload), "the delayed key holds back only itself")
		require.Equal(t, []string{"a1-delayed", "a2"}, []string{string(got[1].Payload), string(got[2].Payload)})
	}
	require.Equal(t, "orders.paid", asink.Delivered()[0].Topic)
	require.Len(t, asink.Delivered(), 2, "audit takes orders.paid only")
}

func TestFanOutArchiveReplayToOneDestination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	router, kcfg, hcfg := e.fanOutConfigs()
	kcfg.Archive, hcfg.Archive = true, true
	var msgs []outbox.Message
	for i := 0; i < 20; i++ {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("k%d", i%3), fmt.Sprint(i)))
	}
	e.write(msgs...)
	ksink, hsink := memory.New(), memory.New()
	_, stopRouter := e.start(router, nil)
	_, stopK := e.start(kcfg, ksink)
	_, stopH := e.start(hcfg, hsink)
	eventually(t, 10*time.Second, func() bool { return e.count("archive") == 40 }, "archived %d of 40 copies", e.count("archive"))
	stopRouter()
	stopK()
	stopH()

	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	n, err := admin.ReplayArchive(ctx, operator.ArchiveSelection{FromAgo: time.Hour}, true)
	require.NoError(t, err)
	require.EqualValues(t, 20, n, "each message once, however many routes archived it")
	_, err = admin.ReplayArchive(ctx, operator.ArchiveSelection{FromAgo: time.Hour, ToRouteOnly: true}, false)
	require.ErrorIs(t, err, operator.ErrReplayRoute)

	n, err = admin.ReplayArchive(ctx, operator.ArchiveSelection{FromAgo: time.Hour, Route: "hook", ToRouteOnly: true}, false)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	require.Equal(t, 0, e.count("messages"))
	require.Equal(t, 20, e.count("deliveries"))
	hsink2, ksink2 := memory.New(), memory.New()
	kcfg.Archive, hcfg.Archive = false, false
	e.start(router, nil)
	rk, _ := e.start(kcfg, ksink2)
	e.start(hcfg, hsink2)
	require.NoError(t, hsink2.WaitFor(waitCtx(t, 10*time.Second), 20))
	checkOrder(t, hsink2.Delivered())
	got := hsink2.Delivered()
	sort.Slice(got, func(i, j int) bool { return got[i].Seq < got[j].Seq })
	for i, m := range got {
		require.Equal(t, fmt.Sprint(i), string(m.Payload), "new ids in the original order")
		require.Equal(t, hsink.Delivered()[indexOfSeq(hsink.Delivered(), fmt.Sprint(i))].ID, m.ID, "keeps the message id")
	}
	claimedAgain(t, rk, 4)
	require.Zero(t, ksink2.Len(), "the other destination gets nothing")
}

func indexOfSeq(ms []sinks.Message, payload string) int {
	for i, m := range ms {
		if string(m.Payload) == payload {
			return i
		}
	}
	return -1
}

func TestFanOutDestinationsHonourPriority(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, _ := e.fanOutConfigs()
	var msgs []outbox.Message
	for i := 0; i < 1000; i++ {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("k%d", i%40), fmt.Sprint(i)))
	}
	e.write(msgs...)
	e.write(msg("orders.created", "vip", "vip-1"))
	e.write(outbox.Message{Topic: "orders.created", Key: "vip", Payload: []byte("vip-urgent"), Priority: 3})
	// Copies first, then the destination: its claims see the whole backlog.
	_, stopRouter := e.start(router, nil)
	eventually(t, 10*time.Second, func() bool { return e.count("deliveries") == 2*1002 }, "copies: %d", e.count("deliveries"))
	stopRouter()
	sink := memory.New()
	kcfg.Workers = 1
	e.start(kcfg, sink)
	require.NoError(t, sink.WaitFor(waitCtx(t, 10*time.Second), 1002))
	got := sink.Delivered()
	checkOrder(t, got)
	require.Equal(t, []string{"vip-1", "vip-urgent"}, []string{string(got[0].Payload), string(got[1].Payload)},
		"the priority key goes first, in its own order")
	var hook int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+e.table("deliveries")+" WHERE route = 'hook' AND priority = 3").Scan(&hook))
	require.Equal(t, 1, hook, "the other destination's copy keeps its priority")
}

// A route that was fed by the router, now configured to read the outbox
// (its fan-out partner was removed), first delivers the copies left for
// it, then the outbox: nothing is stranded and each key keeps its order.
func TestLeftoverCopiesAreDeliveredBeforeTheOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, _, _ := e.fanOutConfigs()
	var first, later []outbox.Message
	for i := 0; i < 300; i++ {
		first = append(first, msg("orders.created", fmt.Sprintf("k%d", i%7), fmt.Sprint(i)))
		later = append(later, msg("orders.created", fmt.Sprintf("k%d", i%7), fmt.Sprint(300+i)))
	}
	e.write(first...)
	_, stopRouter := e.start(router, nil)
	eventually(t, 10*time.Second, func() bool { return e.count("deliveries") == 600 }, "copies: %d", e.count("deliveries"))
	stopRouter()
	e.write(later...)

	// Now "kafka" reads the outbox directly, with other patterns even.
	direct := e.config()
	direct.Route, direct.Topics = "kafka", []string{"orders.created"}
	sink := memory.New()
	e.start(direct, sink)
	require.NoError(t, sink.WaitFor(waitCtx(t, 15*time.Second), 600))
	got := sink.Delivered()
	checkOrder(t, got)
	for i, m := range got {
		var n int
		_, err := fmt.Sscan(string(m.Payload), &n)
		require.NoError(t, err)
		require.Equal(t, i < 300, n < 300, "delivery %d is message %d: the copies go first", i, n)
	}
	eventually(t, 5*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not drained")
	var kafkaCopies int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+e.table("deliveries")+" WHERE route = 'kafka'").Scan(&kafkaCopies))
	require.Zero(t, kafkaCopies)
}
