package relayprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay"
)

// NewSourcesCollector exports, at each scrape, the state of every source
// of a relay.Sources (states is relay.Sources.States):
//
//   - outbox_relay_source_state{source, state}: 1 for the source's state
//     (starting, running, down or stopped), 0 for the others;
//   - outbox_relay_source_restarts_total{source}: times the source's
//     relays started again after stopping with an error;
//   - outbox_relay_source_share_wait_seconds_total{source}: how long the
//     source's workers waited for its part of the batches under way
//     while other sources had work (relay.SourcesConfig.Batches).
func NewSourcesCollector(states func() []relay.SourceState) prometheus.Collector {
	return &sourcesCollector{
		states: states,
		state: prometheus.NewDesc(ns+"_source_state",
			"1 for the source's state (starting: its relays run their start-up checks; running; down: its relays stopped with an error and start again later, see the logs and /readyz; stopped), 0 for the others.",
			[]string{"source", "state"}, nil),
		restarts: prometheus.NewDesc(ns+"_source_restarts_total",
			"Times the source's relays started again after stopping with an error.",
			[]string{"source"}, nil),
		shareWait: prometheus.NewDesc(ns+"_source_share_wait_seconds_total",
			"How long the source's workers waited for its part of the batches under way while other sources had work (--source-batches, weight:): time the source was held back.",
			[]string{"source"}, nil),
	}
}

type sourcesCollector struct {
	states                     func() []relay.SourceState
	state, restarts, shareWait *prometheus.Desc
}

func (c *sourcesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.state
	ch <- c.restarts
	ch <- c.shareWait
}

func (c *sourcesCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.states() {
		for _, s := range []string{relay.SourceStarting, relay.SourceRunning, relay.SourceDown, relay.SourceStopped} {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, one(s == st.State), st.Name, s)
		}
		ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(st.Restarts), st.Name)
		ch <- prometheus.MustNewConstMetric(c.shareWait, prometheus.CounterValue, st.ShareWait.Seconds(), st.Name)
	}
}

func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
