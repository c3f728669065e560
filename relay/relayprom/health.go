package relayprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Checker is what HealthCollector asks: a *relay.Relay or a *relay.Set.
type Checker interface {
	Live() error
	Ready(ctx context.Context) error
}

// NewHealthCollector exports c's liveness and readiness as the gauges
// outbox_relay_live and outbox_relay_ready (1 or 0), asked at each scrape
// (Ready is bounded by timeout), so that an alert can fire on a relay that
// runs but cannot work, beside the orchestrator's probes.
func NewHealthCollector(c Checker, timeout time.Duration) prometheus.Collector {
	return &healthCollector{
		c:       c,
		timeout: timeout,
		live:    prometheus.NewDesc(ns+"_live", "1 when every worker loop of the process turns (what /livez answers), else 0.", nil, nil),
		ready:   prometheus.NewDesc(ns+"_ready", "1 when the process can deliver now (what /readyz answers: lease held, database writable, schema and sink usable), else 0.", nil, nil),
	}
}

type healthCollector struct {
	c           Checker
	timeout     time.Duration
	live, ready *prometheus.Desc
}

func (h *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.live
	ch <- h.ready
}

func (h *healthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	defer cancel()
	ch <- prometheus.MustNewConstMetric(h.live, prometheus.GaugeValue, up(h.c.Live()))
	ch <- prometheus.MustNewConstMetric(h.ready, prometheus.GaugeValue, up(h.c.Ready(ctx)))
}

func up(err error) float64 {
	if err != nil {
		return 0
	}
	return 1
}
