package relayprom_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
)

// A route's outage shows as destination_down 1 while its breaker is open
// and counts once in destination_outages_total.
func TestDestinationDown(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := relayprom.New(reg, "test")
	h := m.Hooks("hooks", "http")
	down := func() float64 {
		return gauge(t, reg, "outbox_relay_destination_down")
	}
	require.Zero(t, down(), "reads 0 before any outage")
	h.Outage(true, time.Now(), errors.New("connection refused"))
	require.Equal(t, 1.0, down())
	h.Outage(false, time.Now(), nil)
	require.Zero(t, down())
	require.Equal(t, 1.0, gauge(t, reg, "outbox_relay_destination_outages_total"))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// gauge returns the value of the one series of metric name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		require.Len(t, mf.GetMetric(), 1)
		m := mf.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// route_state says, for each state, 1 when the route is in it at the
// last heartbeat: delivering before any, then the worst state that holds.
func TestRouteState(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := relayprom.New(reg, "test")
	h := m.Hooks("orders", "http")
	state := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "outbox_relay_route_state" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "state" {
						got[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		return got
	}
	require.Equal(t, map[string]float64{"delivering": 1, "degraded": 0, "rate_limited": 0, "destination_down": 0}, state())
	h.RouteState(relay.RouteState{Failing: true, Limited: true})
	require.Equal(t, map[string]float64{"delivering": 0, "degraded": 0, "rate_limited": 1, "destination_down": 0}, state())
	h.RouteState(relay.RouteState{Failing: true})
	require.Equal(t, map[string]float64{"delivering": 0, "degraded": 1, "rate_limited": 0, "destination_down": 0}, state())
	h.RouteState(relay.RouteState{Open: true, Failing: true})
	require.Equal(t, map[string]float64{"delivering": 0, "degraded": 0, "rate_limited": 0, "destination_down": 1}, state())
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}
