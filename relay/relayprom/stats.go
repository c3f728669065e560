package relayprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay"
)

// NewStatsCollector exports, at each scrape, what the relays that relays
// returns have done since they started, per route: their claim
// transactions and the wake-ups that caused them. At a steady trickle
// these, not the messages, are what the relay costs the database:
//
//   - outbox_relay_claims_total{route, lanes}: claim transactions,
//     lanes="named" for those that visited only the lanes wake-ups named,
//     "all" for those that visited every lane of their worker;
//   - outbox_relay_empty_claims_total{route}: the claims that found
//     nothing;
//   - outbox_relay_wakeups_total{route}: wake-ups received.
//
// relays is relay.Set.Relays in outbox-relay run.
func NewStatsCollector(relays func() []*relay.Relay) prometheus.Collector {
	return &statsCollector{
		relays:  relays,
		claims:  prometheus.NewDesc(ns+"_claims_total", "Claim transactions, empty ones included: lanes=named visited only the lanes that wake-ups named, lanes=all every lane of their worker.", []string{"route", "lanes"}, nil),
		empty:   prometheus.NewDesc(ns+"_empty_claims_total", "Claim transactions that found nothing to deliver.", []string{"route"}, nil),
		wakeups: prometheus.NewDesc(ns+"_wakeups_total", "Wake-ups received (from the watcher's looks, notifications or the WAL stream).", []string{"route"}, nil),
	}
}

type statsCollector struct {
	relays                 func() []*relay.Relay
	claims, empty, wakeups *prometheus.Desc
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.claims
	ch <- c.empty
	ch <- c.wakeups
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.relays() {
		st, route := r.Stats(), r.Route()
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(st.LaneClaims), route, "named")
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(st.Claims-st.LaneClaims), route, "all")
		ch <- prometheus.MustNewConstMetric(c.empty, prometheus.CounterValue, float64(st.EmptyClaims), route)
		ch <- prometheus.MustNewConstMetric(c.wakeups, prometheus.CounterValue, float64(st.Wakeups), route)
	}
}
