package cli

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
)

func TestFanOutRouterFeedsOnlyOverlappingRoutes(t *testing.T) {
	specs := []routeSpec{
		{Name: "orders", Topics: []string{"orders.*"}},
		{Name: "payments", Topics: []string{"orders.paid", "payments.*"}}, // first match: shadowed by orders for orders.paid
		{Name: "users", Topics: []string{"users.*"}},
		{Name: "audit", Topics: []string{"*.created"}, FanOut: true},
		{Name: "lonely", Topics: []string{"metrics"}, FanOut: true},
	}
	var routes []route
	var earlier []string
	for _, sp := range specs {
		cfg := relay.Config{Route: sp.Name, Topics: sp.Topics}
		if !sp.FanOut {
			cfg.ExcludeTopics = append([]string(nil), earlier...)
			earlier = append(earlier, sp.Topics...)
		}
		routes = append(routes, route{cfg: cfg})
	}
	router, ok := fanOutRouter(specs, routes, relay.Config{ID: "r"})
	require.True(t, ok)
	// audit overlaps orders (orders.created) and users (users.created);
	// payments shares orders.paid with orders, so it is fed too.
	fed := map[string]bool{}
	for _, rt := range routes {
		fed[rt.cfg.Route] = rt.cfg.Deliveries
	}
	require.Equal(t, map[string]bool{"orders": true, "payments": true, "users": true, "audit": true, "lonely": false}, fed)
	require.Equal(t, []string{"metrics"}, routes[4].cfg.Topics, "a fan-out route sharing nothing reads the outbox itself")
	require.Equal(t, routerName, router.cfg.Route)
	require.True(t, router.router)

	dest := func(topic string) []string {
		var out []string
		for _, d := range router.cfg.FanOut {
			for _, p := range d.Topics {
				if relay.MatchTopic(p, topic) && !matchAny(d.ExcludeTopics, topic) {
					out = append(out, d.Route)
					break
				}
			}
		}
		return out
	}
	require.Equal(t, []string{"orders", "audit"}, dest("orders.created"))
	require.Equal(t, []string{"orders"}, dest("orders.paid"), "first match wins among ordinary routes")
	require.Equal(t, []string{"payments"}, dest("payments.settled"))
	require.Equal(t, []string{"users", "audit"}, dest("users.created"))
	require.Equal(t, []string{"audit"}, dest("invoices.created"))

	_, ok = fanOutRouter(specs[:3], routes[:3], relay.Config{})
	require.False(t, ok, "no fan-out route, no router")
}

func matchAny(pats []string, topic string) bool {
	for _, p := range pats {
		if relay.MatchTopic(p, topic) {
			return true
		}
	}
	return false
}

func TestConnBudget(t *testing.T) {
	one := []route{{cfg: relay.Config{Workers: 2}}}
	max, workers, err := connBudget(one, 0)
	require.NoError(t, err)
	require.Equal(t, 5, max, "2 workers, lease, LISTEN, and one for health checks and metrics")
	require.Equal(t, 2, workers)
	max, _, err = connBudget(one, 4)
	require.NoError(t, err)
	require.Equal(t, 4, max, "the least: health checks wait for a worker's connection")
	_, _, err = connBudget(one, 3)
	require.ErrorContains(t, err, "max-conns: 3 is below the 4 connections")

	// Routes: per route its workers and lease, one shared LISTEN.
	three := []route{{cfg: relay.Config{Workers: 2}}, {cfg: relay.Config{Workers: 1}}, {cfg: relay.Config{Workers: 1}}}
	max, workers, err = connBudget(three, 0)
	require.NoError(t, err)
	require.Equal(t, 3+2+2+1+1, max)
	require.Equal(t, 4, workers)
	_, _, err = connBudget(three, 7)
	require.ErrorContains(t, err, "below the 8")
}
