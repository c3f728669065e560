package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// A webhook receiver that refuses connections, then answers 503 to every
// request, costs the messages written meanwhile no attempt: the route's
// breaker opens at the first batch that got nothing through, probes with
// one message at a time, and delivers everything in key order once the
// receiver is back. Nothing is dead-lettered although MaxAttempts is 2.
func TestOutageCountsNoAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var unavailable atomic.Bool
	var mu sync.Mutex
	got := map[string][]int{} // key → the seqs accepted, in order
	rc := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if unavailable.Load() {
			return http.StatusServiceUnavailable, "down for maintenance"
		}
		seq, _ := strconv.Atoi(r.Header.Get(httpsink.HeaderSeq))
		mu.Lock()
		got[r.Header.Get(httpsink.HeaderKey)] = append(got[r.Header.Get(httpsink.HeaderKey)], seq)
		mu.Unlock()
		return http.StatusNoContent, ""
	})
	sink, err := httpsink.New(httpsink.Config{URL: rc.URL()}, nil)
	require.NoError(t, err)
	cfg := e.config()
	cfg.MaxAttempts = 2
	r, _ := e.start(cfg, sink)
	e.write(msg("t", "k0", "before"))
	eventually(t, 20*time.Second, func() bool { return rc.Accepted() == 1 }, "first delivery")

	// Refused connections.
	rc.Stop()
	opened := r.SignalCount(relay.SigOutage)
	for i := range 40 {
		e.write(msg("t", fmt.Sprintf("k%d", i%5), fmt.Sprintf("m%d", i)))
	}
	r.AwaitSignal(t, signalBound, relay.SigOutage, opened, func(v int) bool { return v == 1 })
	require.True(t, r.State().Open)
	require.ErrorContains(t, r.State().Cause, "not sent")
	require.ErrorContains(t, r.Ready(context.Background()), "outbox: destination down since")
	probes := r.SignalCount(relay.SigProbed)
	r.AwaitSignal(t, signalBound, relay.SigProbed, probes+1, nil)

	// 503 to every request.
	unavailable.Store(true)
	require.NoError(t, rc.Start())
	probes = r.SignalCount(relay.SigProbed)
	requests := rc.Requests()
	r.AwaitSignal(t, signalBound, relay.SigProbed, probes+1, nil)
	probed := r.SignalCount(relay.SigProbed) - probes
	// One request a probe (a batch claimed before the breaker opened may
	// still have been on its way).
	require.LessOrEqual(t, rc.Requests()-requests, int64(probed+cfg.Workers*cfg.BatchSize))
	require.ErrorContains(t, r.State().Cause, "503")
	var attempts, dead int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT coalesce(max(attempts), 0) FROM "+e.table("messages")).Scan(&attempts))
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table("dead_letters")).Scan(&dead))
	require.Zero(t, attempts, "an outage counts no attempt")
	require.Zero(t, dead)

	// Back.
	closed := r.SignalCount(relay.SigOutage)
	unavailable.Store(false)
	r.AwaitSignal(t, signalBound, relay.SigOutage, closed, func(v int) bool { return v == 0 })
	eventually(t, 20*time.Second, func() bool { return e.count("messages") == 0 }, "outbox drained")
	require.Zero(t, e.count("dead_letters"))
	require.False(t, r.State().Open)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 41, inKeyOrder(t, got))
}

// A message that fails on its own (a 4xx) never opens the breaker, nor
// does a 503 for one key from a receiver that is up (it answers a
// request without a message): the other keys go on, and the 503s count
// attempts until the message is dead-lettered.
func TestOneFailingKeyDoesNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		switch r.Header.Get(httpsink.HeaderKey) {
		case "bad":
			return http.StatusUnprocessableEntity, "no"
		case "busy":
			return http.StatusServiceUnavailable, "this key's shard is down"
		}
		return http.StatusNoContent, ""
	})
	// The receiver is up: a request without a message gets a 204.
	rc.SetHealth(func() int { return http.StatusNoContent })
	sink, err := httpsink.New(httpsink.Config{URL: rc.URL()}, nil)
	require.NoError(t, err)
	cfg := e.config()
	cfg.MaxAttempts = 3
	r, _ := e.start(cfg, sink)
	for i := range 30 {
		e.write(msg("t", fmt.Sprintf("k%d", i%3), "ok"))
	}
	e.write(msg("t", "bad", "x"), msg("t", "busy", "y"))
	eventually(t, 30*time.Second, func() bool { return e.count("dead_letters") == 2 && e.count("messages") == 0 },
		"both failing messages dead-lettered, the rest delivered (%d left)", e.count("messages"))
	require.GreaterOrEqual(t, rc.Accepted(), int64(30))
	require.False(t, r.State().Open)
}

// One route's destination down leaves the other route delivering at its
// pace and the Set ready but degraded, naming the route; with every
// route's destination down the Set is not ready.
func TestOneRouteDownDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := testkit.NewTestReceiver(t, nil)
	webhooks, err := httpsink.New(httpsink.Config{URL: rc.URL()}, nil)
	require.NoError(t, err)
	orders := memory.New()
	set, _, _ := e.startSet(relay.SetConfig{Config: e.config(), Routes: []relay.Route{
		{Name: "orders", Topics: []string{"orders"}, Sink: orders},
		{Name: "hooks", Topics: []string{"hooks"}, Sink: webhooks},
	}})
	hooks := routeRelay(t, set, "hooks")
	e.write(msg("orders", "o", "1"), msg("hooks", "h", "1"))
	require.NoError(t, orders.WaitFor(waitCtx(t, 20*time.Second), 1))
	eventually(t, 20*time.Second, func() bool { return rc.Accepted() == 1 }, "first webhook")
	// Every relay of the Set is ready once its first heartbeat has taken
	// its lanes (the unrouted route, without messages, may lag).
	eventually(t, 20*time.Second, func() bool { return set.Ready(context.Background()) == nil },
		"the Set ready: %v", set.Ready(context.Background()))
	require.Empty(t, set.Degraded(context.Background()))

	rc.Stop()
	opened := hooks.SignalCount(relay.SigOutage)
	for i := range 20 {
		e.write(msg("hooks", fmt.Sprintf("h%d", i%4), "2"))
	}
	hooks.AwaitSignal(t, signalBound, relay.SigOutage, opened, func(v int) bool { return v == 1 })
	for i := range 50 {
		e.write(msg("orders", fmt.Sprintf("o%d", i%4), "2"))
	}
	require.NoError(t, orders.WaitFor(waitCtx(t, 20*time.Second), 51), "the other route delivers meanwhile")
	require.NoError(t, set.Ready(context.Background()), "one route down: degraded, not unready")
	require.Contains(t, set.Degraded(context.Background()), "route hooks: outbox: destination down since")
	require.ErrorContains(t, hooks.Ready(context.Background()), "destination unavailable")

	require.NoError(t, rc.Start())
	closed := hooks.SignalCount(relay.SigOutage)
	hooks.AwaitSignal(t, signalBound, relay.SigOutage, closed, func(v int) bool { return v == 0 })
	eventually(t, 20*time.Second, func() bool { return rc.Accepted() == 21 }, "every webhook delivered (%d)", rc.Accepted())
	require.Empty(t, set.Degraded(context.Background()))
}

// routeRelay returns the relay of set's route name.
func routeRelay(t *testing.T, set *relay.Set, name string) *relay.Relay {
	t.Helper()
	for _, r := range set.Relays() {
		if r.Route() == name {
			return r
		}
	}
	t.Fatalf("no route %q", name)
	return nil
}

// One fan-out destination down opens its own breaker only: the router
// goes on copying, the other destination delivers everything meanwhile,
// and the down destination's copies count no attempt and are delivered
// in key order once it is back.
func TestFanOutDestinationDownLeavesTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, hcfg := e.fanOutConfigs()
	hcfg.MaxAttempts = 2
	ksink, hsink := memory.New(), memory.New()
	down := refuseWhileDown(hsink)
	e.start(router, nil)
	e.start(kcfg, ksink)
	hook, _ := e.start(hcfg, hsink)
	var msgs []outbox.Message
	for i := range 200 {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("o%d", i%8), strconv.Itoa(i)))
	}
	e.write(msgs...)

	hook.AwaitSignal(t, signalBound, relay.SigOutage, 0, func(v int) bool { return v == 1 })
	require.NoError(t, ksink.WaitFor(waitCtx(t, 20*time.Second), 200), "the other destination delivers meanwhile")
	require.Zero(t, hsink.Len())
	var attempts int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT coalesce(max(attempts), 0) FROM `+e.table("deliveries")).Scan(&attempts))
	require.Zero(t, attempts, "a copy counted an attempt while its destination was down")

	closed := hook.SignalCount(relay.SigOutage)
	down.Store(false)
	hook.AwaitSignal(t, signalBound, relay.SigOutage, closed, func(v int) bool { return v == 0 })
	require.NoError(t, hsink.WaitFor(waitCtx(t, 20*time.Second), 200))
	checkOrder(t, hsink.Delivered())
	require.Zero(t, e.count("dead_letters"))
}

// One of two webhook hosts down, refusing connections and then answering
// 503 to everything, holds back its own messages only: the other host's
// keep flowing, the relay stays ready (degraded, naming the host), the
// down host's messages count no attempt, and they all arrive in key
// order once it is back.
func TestOneWebhookHostDownLeavesTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var unavailable atomic.Bool
	var mu sync.Mutex
	got := map[string][]int{} // key → the seqs host A accepted, in order
	hostA := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if unavailable.Load() {
			return http.StatusServiceUnavailable, "down for maintenance"
		}
		seq, _ := strconv.Atoi(r.Header.Get(httpsink.HeaderSeq))
		mu.Lock()
		got[r.Header.Get(httpsink.HeaderKey)] = append(got[r.Header.Get(httpsink.HeaderKey)], seq)
		mu.Unlock()
		return http.StatusNoContent, ""
	})
	hostB, sink := twoHosts(t, hostA)
	cfg := e.config()
	cfg.MaxAttempts = 2
	r, _ := e.start(cfg, sink)
	e.write(msg("a.x", "a0", "before"), msg("b.x", "b0", "before"))
	eventually(t, 20*time.Second, func() bool { return hostA.Accepted() == 1 && hostB.Accepted() == 1 }, "first deliveries")

	hostA.Stop()
	for i := range 40 {
		host := []string{"a", "b"}[i%2]
		e.write(msg(host+".x", fmt.Sprintf("%s%d", host, i%5), strconv.Itoa(i)))
	}
	eventually(t, 20*time.Second, func() bool { return hostB.Accepted() == 21 }, "host B's messages delivered while host A is down")
	degraded, err := r.Readiness(context.Background())
	require.NoError(t, err, "one host of two down made the relay unready")
	require.Contains(t, degraded, "1 of 2 destinations unavailable")
	require.Contains(t, degraded, hostA.Addr())
	st := r.State()
	require.Equal(t, relay.RouteDegraded, st.Health(), "status and metrics say what /readyz says")
	require.ErrorContains(t, st.LastError, hostA.Addr())

	unavailable.Store(true)
	require.NoError(t, hostA.Start())
	probes := hostA.Requests()
	eventually(t, 20*time.Second, func() bool { return hostA.Requests() > probes }, "a probe of host A")
	var attempts, dead int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT coalesce(max(attempts), 0) FROM "+e.table("messages")).Scan(&attempts))
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table("dead_letters")).Scan(&dead))
	require.Zero(t, attempts, "a host's outage counts no attempt")
	require.Zero(t, dead)
	require.False(t, r.State().Open, "the route's state went down for one host")

	unavailable.Store(false)
	eventually(t, 30*time.Second, func() bool { return e.count("messages") == 0 }, "outbox drained")
	degraded, err = r.Readiness(context.Background())
	require.NoError(t, err)
	require.Empty(t, degraded)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 21, inKeyOrder(t, got))
}

// inKeyOrder asserts that the seqs each key's receiver accepted grow, and
// returns how many there are.
func inKeyOrder(t *testing.T, got map[string][]int) int {
	t.Helper()
	n := 0
	for key, seqs := range got {
		for i := 1; i < len(seqs); i++ {
			require.Less(t, seqs[i-1], seqs[i], "key %s out of order: %v", key, seqs)
		}
		n += len(seqs)
	}
	return n
}

// twoHosts returns a webhook sink that posts topics a.* to hostA and b.*
// to a second host, which accepts everything and is returned too.
func twoHosts(t *testing.T, hostA *testkit.Receiver) (*testkit.Receiver, *httpsink.Sink) {
	t.Helper()
	hostB := testkit.NewTestReceiver(t, nil)
	sink, err := httpsink.New(httpsink.Config{Routes: []httpsink.Route{
		{Topic: "a.*", URL: hostA.URL()}, {Topic: "b.*", URL: hostB.URL()},
	}}, nil)
	require.NoError(t, err)
	return hostB, sink
}
