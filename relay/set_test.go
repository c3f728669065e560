package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
	"github.com/outbox-relay/outbox-relay/topic"
)

func TestSetPlanFeedsOnlyOverlappingRoutes(t *testing.T) {
	t.Parallel()
	sc := relay.SetConfig{Config: relay.Config{ID: "r", OnDeadLetter: relay.OnDeadLetterHold}, Routes: []relay.Route{
		{Name: "orders", Topics: []string{"orders.*"}},
		{Name: "payments", Topics: []string{"orders.paid", "payments.*"}}, // first match: shadowed by orders for orders.paid
		{Name: "users", Topics: []string{"users.*"}},
		{Name: "audit", Topics: []string{"*.created"}, FanOut: true},
		{Name: "lonely", Topics: []string{"metrics"}, FanOut: true},
	}}
	cfgs, err := sc.Plan()
	require.NoError(t, err)
	byRoute := map[string]relay.Config{}
	for _, c := range cfgs {
		byRoute[c.Route] = c
		require.Equal(t, "r/"+c.Route, c.ID)
		require.True(t, relay.SharedListener(c), "one LISTEN for all")
	}
	require.Len(t, cfgs, 7, "the routes, the router and the unrouted route")
	// audit overlaps orders (orders.created) and users (users.created);
	// payments shares orders.paid with orders, so it is fed too.
	fed := map[string]bool{}
	for _, rt := range sc.Routes {
		fed[rt.Name] = relay.Deliveries(byRoute[rt.Name])
	}
	require.Equal(t, map[string]bool{"orders": true, "payments": true, "users": true, "audit": true, "lonely": false}, fed)
	require.Equal(t, []bool{true, true, true, true, false}, relay.RouterFeeds(sc.Routes))
	require.Equal(t, []string{"metrics"}, byRoute["lonely"].Topics, "a fan-out route sharing nothing reads the outbox itself")
	router := byRoute[relay.RouterRoute]
	require.Equal(t, relay.RouterRoute, cfgs[5].Route)

	dest := func(tp string) []string {
		var out []string
		for _, d := range relay.FanOutOf(router) {
			if topic.MatchAny(d.Topics, tp) && !topic.MatchAny(d.ExcludeTopics, tp) {
				out = append(out, d.Route)
			}
		}
		return out
	}
	require.Equal(t, []string{"orders", "audit"}, dest("orders.created"))
	require.Equal(t, []string{"orders"}, dest("orders.paid"), "first match wins among ordinary routes")
	require.Equal(t, []string{"payments"}, dest("payments.settled"))
	require.Equal(t, []string{"users", "audit"}, dest("users.created"))
	require.Equal(t, []string{"audit"}, dest("invoices.created"))

	unrouted := cfgs[6]
	require.Equal(t, relay.UnroutedRoute, unrouted.Route)
	require.Equal(t, relay.OnDeadLetterSkip, unrouted.OnDeadLetter, "what no route takes holds nothing")
	require.Equal(t, relay.OnDeadLetterHold, byRoute["orders"].OnDeadLetter, "the routes inherit the policy")
	require.Equal(t, []string{"orders.*", "orders.paid", "payments.*", "users.*", "*.created", "metrics"}, unrouted.ExcludeTopics)

	sc.Routes = sc.Routes[:3]
	cfgs, err = sc.Plan()
	require.NoError(t, err)
	require.Len(t, cfgs, 4, "no fan-out route, no router")
	require.False(t, relay.Deliveries(cfgs[0]))
	require.Equal(t, []string{"orders.*"}, cfgs[1].ExcludeTopics, "the first match wins")

	sc.Routes = []relay.Route{{Name: "all", Topics: []string{"*"}}}
	cfgs, err = sc.Plan()
	require.NoError(t, err)
	require.Len(t, cfgs, 1, `a route takes "*": nothing is unrouted`)
	require.False(t, relay.SharedListener(cfgs[0]), "alone, the relay listens itself")
	require.Equal(t, 2+1+1, sc.Conns())
}

func TestSetPlanRouteConfigAndHooks(t *testing.T) {
	t.Parallel()
	own := relay.Config{Workers: 5, MaxAttempts: 3, Schema: "ignored", Route: "ignored", Producer: "ignored"}
	var hooked []string
	sc := relay.SetConfig{
		Config: relay.Config{Schema: "s", Workers: 1, Producer: "orders"},
		Routes: []relay.Route{{Name: "a", Topics: []string{"a"}, Config: &own}, {Name: "b", Topics: []string{"b"}}},
		Hooks:  func(route string) relay.Hooks { hooked = append(hooked, route); return nil },
	}
	cfgs, err := sc.Plan()
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", relay.UnroutedRoute}, hooked)
	require.Equal(t, 5, cfgs[0].Workers)
	require.Equal(t, 3, cfgs[0].MaxAttempts)
	require.Equal(t, "s", cfgs[0].Schema, "every route reads the Set's schema")
	for _, c := range cfgs {
		require.Equal(t, "orders", c.Producer, "%s: every route names the Set's outbox alike", c.Route)
	}
	require.Equal(t, "a", cfgs[0].Route)
	require.Equal(t, 1, cfgs[1].Workers, "no config of its own: the Set's")
	require.Equal(t, relay.Conns(cfgs...), sc.Conns())
	require.Equal(t, (5+1)+(1+1)+(1+1)+1, sc.Conns())
}

func TestSetPlanErrorsNameRouteAndField(t *testing.T) {
	t.Parallel()
	ok := relay.Route{Name: "a", Topics: []string{"a"}}
	for _, c := range []struct {
		routes []relay.Route
		want   string
	}{
		{nil, "outbox: routes: at least one route is required"},
		{[]relay.Route{ok, {Name: "B", Topics: []string{"b"}}}, `outbox: routes[1].name: "B" must be 1-63 lower-case`},
		{[]relay.Route{ok, {Name: "~fanout", Topics: []string{"b"}}}, `routes[1].name`},
		{[]relay.Route{ok, ok}, `outbox: routes[1].name: "a" used twice`},
		{[]relay.Route{{Name: "a"}}, "outbox: routes[0].topics: at least one topic pattern is required"},
		{[]relay.Route{{Name: "a", Topics: []string{""}}}, "routes[0]: outbox: topics: patterns must not be empty"},
		{[]relay.Route{{Name: "a", Topics: []string{"a"}, Config: &relay.Config{MaxAttempts: -1}}}, "routes[0]: outbox: max-attempts: must be at least 1"},
		{[]relay.Route{ok, {Name: relay.UnroutedRoute, Topics: []string{"b"}}}, `outbox: routes[1].name: "unrouted" is the built-in route`},
	} {
		_, err := relay.SetConfig{Routes: c.routes}.Plan()
		require.ErrorContains(t, err, c.want)
		require.Zero(t, relay.SetConfig{Routes: c.routes}.Conns())
	}
	// With a catch-all route there is no built-in "unrouted": the name is free.
	_, err := relay.SetConfig{Routes: []relay.Route{{Name: relay.UnroutedRoute, Topics: []string{"*"}}}}.Plan()
	require.NoError(t, err)
	pool, _ := pgtest.Schema(t)
	_, err = relay.NewSet(pool, relay.SetConfig{Routes: []relay.Route{ok}})
	require.ErrorContains(t, err, "outbox: routes[0].sink: required")
}

// startSet runs a Set on a pool of its own until the test ends and
// returns it with stop, which cancels Run and returns its error.
func (e *env) startSet(sc relay.SetConfig) (set *relay.Set, stop func() error, done <-chan struct{}) {
	e.t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), MaxConns: sc.Conns() + 1})
	require.NoError(e.t, err)
	e.t.Cleanup(pool.Close)
	set, err = relay.NewSet(pool, sc)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	var runErr error
	go func() { runErr = set.Run(ctx); close(finished) }()
	stop = func() error {
		cancel()
		select {
		case <-finished:
			return runErr
		case <-time.After(30 * time.Second):
			return errors.New("set did not stop within 30s")
		}
	}
	e.t.Cleanup(func() { _ = stop() })
	return set, stop, finished
}

// A library user gets fan-out from routes alone: the Set adds the router,
// feeds the overlapping routes and dead-letters what no route takes.
func TestSetFanOutDeliversToBothRoutes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	orders, audit := memory.New(), memory.New()
	cfg := e.config()
	cfg.PollInterval = time.Hour // only the shared LISTEN wakes them in time
	set, stop, _ := e.startSet(relay.SetConfig{Config: cfg, Routes: []relay.Route{
		{Name: "orders", Topics: []string{"orders.*"}, Sink: orders},
		{Name: "audit", Topics: []string{"*.created"}, FanOut: true, Sink: audit},
	}})
	require.Len(t, set.Relays(), 4, "orders, audit, the router, unrouted")
	e.write(msg("orders.created", "o1", "1"), msg("orders.paid", "o1", "2"), msg("users.created", "u1", "3"), msg("other", "x", "4"))
	require.NoError(t, orders.WaitFor(waitCtx(t, 20*time.Second), 2))
	require.NoError(t, audit.WaitFor(waitCtx(t, 20*time.Second), 2))
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 1 }, "the unrouted message is dead-lettered")
	require.Equal(t, []string{"orders.created", "orders.paid"}, topics(orders.Delivered()))
	require.Equal(t, []string{"orders.created", "users.created"}, topics(audit.Delivered()))
	require.NoError(t, set.Live())
	eventually(t, 20*time.Second, func() bool { return set.Ready(context.Background()) == nil },
		"the Set ready: %v", set.Ready(context.Background()))
	require.NoError(t, stop())
	require.ErrorContains(t, set.Ready(context.Background()), "draining")
}

// One route failing to start stops the others: a process must not
// half-run.
func TestSetOneRouteFailingStopsTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The archive route cannot create its partitions.
	_, err := e.pool.Exec(context.Background(), "DROP TABLE "+e.table("archive")+" CASCADE")
	require.NoError(t, err)
	broken := e.config()
	broken.Archive = true
	_, stop, done := e.startSet(relay.SetConfig{Config: e.config(), Routes: []relay.Route{
		{Name: "fine", Topics: []string{"a"}, Sink: memory.New()},
		{Name: "broken", Topics: []string{"b"}, Sink: memory.New(), Config: &broken},
	}})
	select {
	case <-done:
		require.ErrorContains(t, stop(), "archive")
	case <-time.After(30 * time.Second):
		t.Fatal("the set kept running with a route down")
	}
}

// Ready answers for every relay of the Set: one route's sick sink makes
// the whole Set unready.
func TestSetReadyOverAllRoutes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	set, _, _ := e.startSet(relay.SetConfig{Config: e.config(), Routes: []relay.Route{
		{Name: "fine", Topics: []string{"a"}, Sink: memory.New()},
		{Name: "sick", Topics: []string{"b"}, Sink: sickSink{memory.New()}},
	}})
	eventually(t, 20*time.Second, func() bool {
		return set.Degraded(context.Background()) == "route sick: outbox: sink: down"
	}, "the sick route makes the set degraded")
	require.NoError(t, set.Ready(context.Background()), "one route of two is sick: degraded, still ready")
	require.NoError(t, set.Live())

	// Asked to, the Set is not ready as soon as one route is down.
	strict, _, _ := e.startSet(relay.SetConfig{Config: e.config(), ReadyOnEveryRoute: true, Routes: []relay.Route{
		{Name: "fine", Topics: []string{"a"}, Sink: memory.New()},
		{Name: "sick", Topics: []string{"b"}, Sink: sickSink{memory.New()}},
	}})
	eventually(t, 20*time.Second, func() bool {
		err := strict.Ready(context.Background())
		return err != nil && err.Error() == "route sick: outbox: sink: down"
	}, "one route down makes a Set that requires every route unready: %v", strict.Ready(context.Background()))

	// Every route sick: not ready, each named. A schema of its own: its
	// routes are configured otherwise than those above (other topics left
	// to earlier routes), and its relays would wait for theirs to leave.
	e = setup(t)
	all, _, _ := e.startSet(relay.SetConfig{Config: e.config(), Routes: []relay.Route{
		{Name: "sick", Topics: []string{"b"}, Sink: sickSink{memory.New()}},
		{Name: "ill", Topics: []string{"c"}, Sink: sickSink{memory.New()}},
	}})
	eventually(t, 20*time.Second, func() bool {
		err := all.Ready(context.Background())
		return err != nil && err.Error() == "route sick: outbox: sink: down\nroute ill: outbox: sink: down"
	}, "every route sick makes the set unready")

	// A route held to its rate limit delivers: the Set is ready, and
	// says which route waits and for what (a schema of its own: the
	// sets above would dead-letter its topic as unrouted).
	e = setup(t)
	slow := e.config()
	slow.RateLimit, slow.RateBurst = 2, 1
	limited, _, _ := e.startSet(relay.SetConfig{Config: e.config(), Routes: []relay.Route{
		{Name: "fine", Topics: []string{"a"}, Sink: memory.New()},
		{Name: "slow", Topics: []string{"s"}, Sink: memory.New(), Config: &slow},
	}})
	e.write(msg("s", "k1", "1"), msg("s", "k2", "2"), msg("s", "k3", "3"), msg("s", "k4", "4"))
	var why string
	var readyErr error
	eventually(t, 20*time.Second, func() bool {
		why, readyErr = limited.Readiness(context.Background())
		return strings.HasPrefix(why, "route slow: outbox: rate limited since ")
	}, "the rate-limited route is named: %q", why)
	require.Contains(t, why, "rate limit 2/s (burst 1)")
	require.NoError(t, readyErr)
}

type sickSink struct{ *memory.Sink }

func (sickSink) Healthy(context.Context) error { return errors.New("down") }

// topics returns the messages' topics, sorted.
func topics(msgs []sinks.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Topic
	}
	sort.Strings(out)
	return out
}

// With IsolateRoutes every route takes the router's copies: a route whose
// destination is down keeps its backlog among its own copies (the
// deliveries table, indexed by route), so the outbox the other routes'
// claims would walk holds none of it, and the other route delivers
// meanwhile. Back up, the route delivers its backlog in key order.
func TestSetIsolatedRoutesKeepABacklogApart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	orders, audit := memory.New(), memory.New()
	down := refuseWhileDown(orders)
	sc := relay.SetConfig{Config: e.config(), IsolateRoutes: true, Routes: []relay.Route{
		{Name: "orders", Topics: []string{"orders.*"}, Sink: orders},
		{Name: "audit", Topics: []string{"audit.*"}, Sink: audit},
	}}
	cfgs, err := sc.Plan()
	require.NoError(t, err)
	require.Len(t, cfgs, 4, "orders, audit, the router, unrouted")
	require.True(t, relay.Deliveries(cfgs[0]) && relay.Deliveries(cfgs[1]), "both routes take copies")
	require.Equal(t, []bool{true, true}, sc.Feeds())
	require.Equal(t, relay.RouterRoute, cfgs[2].Route)
	sc.IsolateRoutes = false
	plain, err := sc.Plan()
	require.NoError(t, err)
	require.Len(t, plain, 3, "without isolation the routes read the outbox: no router")
	require.Equal(t, []bool{false, false}, sc.Feeds())
	sc.IsolateRoutes = true

	set, _, _ := e.startSet(sc)
	var msgs []outbox.Message
	for i := range 300 {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("o%d", i%10), fmt.Sprintf("o%d-%d", i%10, i)))
	}
	e.write(msgs...)
	msgs = msgs[:0]
	for i := range 50 {
		msgs = append(msgs, msg("audit.logged", fmt.Sprintf("a%d", i%5), fmt.Sprintf("a%d", i)))
	}
	e.write(msgs...)
	require.NoError(t, audit.WaitFor(waitCtx(t, 20*time.Second), 50), "audit delivers beside the orders outage")
	eventually(t, 20*time.Second, func() bool { return e.count("messages") == 0 },
		"the router leaves no row in the outbox (%d left)", e.count("messages"))
	// The sink holds audit's 50 before their copies are settled: wait for
	// the settlement, not only the delivery.
	var ordersCopies, others int
	eventually(t, 20*time.Second, func() bool {
		require.NoError(t, e.pool.QueryRow(context.Background(),
			"SELECT count(*) FILTER (WHERE route = 'orders'), count(*) FILTER (WHERE route <> 'orders') FROM "+e.table("deliveries")).
			Scan(&ordersCopies, &others))
		return others == 0
	}, "audit's copies are settled")
	require.Equal(t, 300, ordersCopies, "the orders backlog waits among the orders copies")
	require.Zero(t, orders.Len())
	require.Zero(t, set.Relays()[0].Stats().Retried, "an outage spends no attempt")

	down.Store(false)
	require.NoError(t, orders.WaitFor(waitCtx(t, 60*time.Second), 300))
	checkOrder(t, orders.Delivered())
	checkOrder(t, audit.Delivered())
	eventually(t, 20*time.Second, func() bool { return e.count("deliveries") == 0 }, "copies left")
}
