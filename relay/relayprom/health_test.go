package relayprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay/relayprom"
)

type checker struct{ live, ready error }

func (c *checker) Live() error                 { return c.live }
func (c *checker) Ready(context.Context) error { return c.ready }

// The gauges follow what Live and Ready answer at each scrape.
func TestHealthCollector(t *testing.T) {
	c := &checker{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(relayprom.NewHealthCollector(c, time.Second))
	check := func(live, ready float64) {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
		require.Equal(t, map[string]float64{"outbox_relay_live": live, "outbox_relay_ready": ready}, got)
	}
	check(1, 1)
	c.ready = errors.New("outbox: draining")
	check(1, 0)
	c.live = errors.New("outbox: worker 0 stuck for 3m")
	check(0, 0)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}
