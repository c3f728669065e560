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
