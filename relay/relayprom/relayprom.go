// Package relayprom exports a relay's activity as Prometheus metrics. It
// implements relay.Hooks, adds gauges computed by a cheap periodic query of
// the outbox (backlog, oldest pending age, dead letters), and a collector
// for the pgx pool. The relay package itself knows nothing of Prometheus.
//
// No metric is labelled by message id or key.
package relayprom

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

const ns = "outbox_relay"

// Metrics holds the relay metrics of one process; Hooks gives the
// relay.Hooks of one route.
type Metrics struct {
	published     *prometheus.CounterVec
	publishErrors *prometheus.CounterVec
	deadLettered  *prometheus.CounterVec
	retried       *prometheus.CounterVec
	untouched     *prometheus.CounterVec
	commitFails   *prometheus.CounterVec
	cycleErrors   *prometheus.CounterVec
	destDown      *prometheus.GaugeVec
	outages       *prometheus.CounterVec
	routeState    *prometheus.GaugeVec
	publishDur    *prometheus.HistogramVec
	latency       *prometheus.HistogramVec
	batchSize     *prometheus.HistogramVec
	claimDur      prometheus.Histogram
	settleDur     prometheus.Histogram
	lanes         *prometheus.GaugeVec
	unworked      *prometheus.GaugeVec
	routeConfigs  *prometheus.GaugeVec
	wakeSource    *prometheus.GaugeVec
	wakeFallbacks prometheus.Counter

	pending      prometheus.Gauge
	oldestAge    prometheus.Gauge
	retrying     prometheus.Gauge
	delayed      prometheus.Gauge
	deadLetters  prometheus.Gauge
	heldKeys     *prometheus.GaugeVec
	oldestHold   *prometheus.GaugeVec
	heldMu       sync.Mutex
	heldRoutes   map[string]bool // routes with held-key series, for deleting them
	scrapeErrors prometheus.Counter

	// reg and registered are where and what newMetrics registered, for
	// Unregister.
	reg        prometheus.Registerer
	registered []prometheus.Collector
}

// New registers the relay metrics on reg. Series about deliveries are
// labelled by route ("" for a relay without routes) and sink (the label
// of the sink's driver, sinks.Driver.Label, for example "kafka").
func New(reg prometheus.Registerer, version string) *Metrics {
	RegisterBuildInfo(reg, version)
	return newMetrics(reg)
}

// NewSource registers on reg the metrics of one source of a
// relay.Sources: the series of New, each labelled source=name, but
// outbox_relay_build_info (see RegisterBuildInfo), which is the
// process's. Its WatchOutbox counts that source's outbox.
func NewSource(reg prometheus.Registerer, source string) *Metrics {
	return newMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"source": source}, reg))
}

// Unregister removes m's series from the registerer they were registered
// on: those of a source that relay.Sources.Remove stopped, so that the
// source's name can be used again. m's hooks must no longer be called.
func (m *Metrics) Unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
}

// RegisterBuildInfo registers outbox_relay_build_info, the gauge that
// names the relay's version and Go version (New registers it).
func RegisterBuildInfo(reg prometheus.Registerer, version string) {
	goVersion := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "build_info",
		Help:        "Build information; the value is always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": goVersion},
	})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
}

func newMetrics(reg prometheus.Registerer) *Metrics {
	latencyBuckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	m := &Metrics{
		published: newCounterVec("messages_published_total",
			"Messages the sink accepted.",
			"route", "sink"),
		publishErrors: newCounterVec("publish_errors_total",
			"Failed delivery attempts, by kind: retriable, permanent or timeout.",
			"route", "sink", "reason"),
		deadLettered: newCounterVec("messages_dead_lettered_total",
			"Messages moved to the dead-letter table, by reason: permanent or max_attempts.",
			"route", "sink", "reason"),
		retried: newCounterVec("retries_scheduled_total",
			"Failed deliveries scheduled for another attempt.",
			"route", "sink"),
		untouched: newCounterVec("messages_held_back_total",
			"Messages not attempted because an earlier message of their key failed in the same batch.",
			"route", "sink"),
		commitFails: newCounterVec("settle_failures_total",
			"Batches whose outcome could not be committed; their delivered messages will be delivered again.",
			"route", "sink"),
		cycleErrors: newCounterVec("cycle_errors_total",
			"Claim-publish-settle cycles that failed on the database side (unreachable, read-only, connection lost); the worker backs off.",
			"route"),
		destDown: newGaugeVec("destination_down",
			"1 while the route's destination is down as a whole (its outage breaker is open: the route claims one message at a time as a probe, and counts no attempt), 0 otherwise.",
			"route", "sink"),
		outages: newCounterVec("destination_outages_total",
			"Times the route's outage breaker opened.",
			"route", "sink"),
		routeState: newGaugeVec("route_state",
			"1 for the route's state at this process's last heartbeat, 0 for the others: delivering (healthy), degraded (messages failed and counted attempts within a heartbeat interval), rate_limited (it waited for its rate limit or a Retry-After within a heartbeat interval) or destination_down (its outage breaker is open); the worst that holds.",
			"route", "sink", "state"),
		publishDur: newHistogramVec("publish_duration_seconds",
			"Time the sink took to accept or reject a batch.",
			latencyBuckets, "route", "sink"),
		latency: newHistogramVec("delivery_latency_seconds",
			"From the writing transaction's start to the sink's acceptance, on the database clock.",
			latencyBuckets, "route", "sink"),
		batchSize: newHistogramVec("batch_size_messages",
			"Messages per claimed batch.",
			[]float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}, "route", "sink"),
		claimDur: newHistogram("claim_duration_seconds",
			"Time to claim a batch (connection, transaction start, claim query).",
			latencyBuckets),
		settleDur: newHistogram("settle_duration_seconds",
			"Time to record a batch's outcome and commit.",
			latencyBuckets),
		lanes: newGaugeVec("lanes_owned",
			"Lanes (of 256 per route) this process currently owns.",
			"route"),
		unworked: newGaugeVec("unworked_lanes",
			"Lanes of the route that no live relay has worked for longer than a lease TTL, as seen at this process's last heartbeat (missing lane rows included); their messages wait. 0 normally.",
			"route"),
		routeConfigs: newGaugeVec("route_configurations",
			"Configurations (topics, sink, format, dead-letter policy, fan-out) the live relays of the route run, as seen at this process's last heartbeat: 1 normally, more while relays of another configuration share the route (run --allow-config-change) or wait for it (see the logs).",
			"route"),
		wakeSource: newGaugeVec("wakeup_source",
			"1 for how this process learns of new rows (wal or poll: it is the database's watcher; follow: another process watches and notifies it; notify: the writers' trigger; -: its LISTEN connection is down), 0 for the others.",
			"mode"),
		wakeFallbacks: newCounter("wakeup_wal_fallbacks_total",
			"Times the watcher wanted to follow the WAL and polled instead (the stream broke, or logical replication is not allowed: see the logs)."),
		pending: newGauge("pending_messages",
			"Messages in the outbox and fan-out copies not yet delivered (all relays), as of the last periodic check."),
		oldestAge: newGauge("oldest_pending_age_seconds",
			"Age of the oldest message in the outbox or fan-out copy not yet delivered: the main lag signal. 0 when empty."),
		retrying: newGauge("retrying_messages",
			"Messages in the outbox and fan-out copies that failed at least once and are neither delivered nor dead, whether or not their next attempt is due."),
		delayed: newGauge("delayed_messages",
			"Messages in the outbox and fan-out copies written with a delivery time still to come."),
		deadLetters: newGauge("dead_letters",
			"Messages in the dead-letter table."),
		heldKeys: newGaugeVec("held_keys",
			"Keys a route with on-dead-letter hold keeps waiting behind a dead letter until it is replayed or purged (all relays). The series of a route goes when it holds nothing.",
			"route"),
		oldestHold: newGaugeVec("oldest_hold_age_seconds",
			"How long the route's oldest held key has waited for an operator.",
			"route"),
		heldRoutes: map[string]bool{},
		scrapeErrors: newCounter("outbox_check_errors_total",
			"Failed periodic outbox checks (the backlog gauges keep their last value)."),
	}
	m.reg = reg
	m.registered = []prometheus.Collector{m.published, m.publishErrors, m.deadLettered, m.retried, m.untouched, m.commitFails, m.cycleErrors,
		m.destDown, m.outages, m.routeState, m.publishDur, m.latency, m.batchSize, m.claimDur, m.settleDur, m.lanes, m.unworked, m.routeConfigs,
		m.wakeSource, m.wakeFallbacks, m.pending, m.oldestAge, m.retrying, m.delayed, m.deadLetters, m.heldKeys, m.oldestHold, m.scrapeErrors}
	reg.MustRegister(m.registered...)
	return m
}

// Hooks returns the relay.Hooks that record the activity of one route
// publishing to one sink.
func (m *Metrics) Hooks(route, sink string) relay.Hooks {
	// Series that should read 0 rather than be absent before the first
	// event.
	m.published.WithLabelValues(route, sink)
	m.retried.WithLabelValues(route, sink)
	m.untouched.WithLabelValues(route, sink)
	m.commitFails.WithLabelValues(route, sink)
	m.cycleErrors.WithLabelValues(route)
	m.destDown.WithLabelValues(route, sink)
	m.outages.WithLabelValues(route, sink)
	m.unworked.WithLabelValues(route)
	m.lanes.WithLabelValues(route)
	for _, r := range []string{relay.ReasonPermanent, relay.ReasonMaxAttempts} {
		m.deadLettered.WithLabelValues(route, sink, r)
	}
	for _, r := range []string{"retriable", "permanent", "timeout"} {
		m.publishErrors.WithLabelValues(route, sink, r)
	}
	h := &routeHooks{m: m, route: route, sink: sink}
	h.RouteState(relay.RouteState{}) // delivering until a heartbeat says otherwise
	return h
}

type routeHooks struct {
	m           *Metrics
	route, sink string
}

// Batch implements relay.Hooks.
func (h *routeHooks) Batch(ev relay.BatchEvent) {
	m := h.m
	m.claimDur.Observe(ev.ClaimDuration.Seconds())
	if ev.Claimed == 0 {
		return
	}
	m.batchSize.WithLabelValues(h.route, h.sink).Observe(float64(ev.Claimed))
	m.publishDur.WithLabelValues(h.route, h.sink).Observe(ev.SendDuration.Seconds())
	m.settleDur.Observe(ev.SettleDuration.Seconds())
	if !ev.Committed {
		m.commitFails.WithLabelValues(h.route, h.sink).Inc()
		return
	}
	m.published.WithLabelValues(h.route, h.sink).Add(float64(ev.Delivered))
	m.retried.WithLabelValues(h.route, h.sink).Add(float64(ev.Retried))
	m.untouched.WithLabelValues(h.route, h.sink).Add(float64(ev.Untouched))
	for _, r := range ev.DeadReasons {
		m.deadLettered.WithLabelValues(h.route, h.sink, r).Inc()
	}
	if failed := ev.Retried + ev.DeadLettered; failed > 0 {
		reason := "retriable"
		switch {
		case errors.Is(ev.SendErr, context.DeadlineExceeded):
			reason = "timeout"
		case ev.Retried == 0:
			reason = "permanent"
		}
		if ev.Retried > 0 && ev.DeadLettered > 0 {
			m.publishErrors.WithLabelValues(h.route, h.sink, "retriable").Add(float64(ev.Retried))
			m.publishErrors.WithLabelValues(h.route, h.sink, "permanent").Add(float64(ev.DeadLettered))
		} else {
			m.publishErrors.WithLabelValues(h.route, h.sink, reason).Add(float64(failed))
		}
	}
	if !ev.AckedAt.IsZero() {
		h := m.latency.WithLabelValues(h.route, h.sink)
		for _, msg := range ev.DeliveredMessages {
			h.Observe(ev.AckedAt.Sub(msg.CreatedAt).Seconds())
		}
	}
}

// Outage implements relay.Hooks.
func (h *routeHooks) Outage(open bool, _ time.Time, _ error) {
	if open {
		h.m.outages.WithLabelValues(h.route, h.sink).Inc()
		h.m.destDown.WithLabelValues(h.route, h.sink).Set(1)
		return
	}
	h.m.destDown.WithLabelValues(h.route, h.sink).Set(0)
}

// routeStates are the values of route_state's state label.
var routeStates = []string{relay.RouteDelivering, relay.RouteDegraded, relay.RouteRateLimited, relay.RouteDestinationDown}

// RouteState implements relay.Hooks.
func (h *routeHooks) RouteState(st relay.RouteState) {
	now := st.Health()
	for _, s := range routeStates {
		v := 0.0
		if s == now {
			v = 1
		}
		h.m.routeState.WithLabelValues(h.route, h.sink, s).Set(v)
	}
}

// CycleError implements relay.Hooks.
func (h *routeHooks) CycleError(error) { h.m.cycleErrors.WithLabelValues(h.route).Inc() }

// Wakeup implements relay.Hooks.
func (h *routeHooks) Wakeup(source string, fallback bool, _ error) {
	for _, s := range []string{"wal", "poll", "follow", "notify", "-"} {
		v := 0.0
		if s == source {
			v = 1
		}
		h.m.wakeSource.WithLabelValues(s).Set(v)
	}
	if fallback {
		h.m.wakeFallbacks.Inc()
	}
}

// UnworkedLanes implements relay.Hooks.
func (h *routeHooks) UnworkedLanes(n int) { h.m.unworked.WithLabelValues(h.route).Set(float64(n)) }

// RouteConfigs implements relay.Hooks.
func (h *routeHooks) RouteConfigs(n int) { h.m.routeConfigs.WithLabelValues(h.route).Set(float64(n)) }

// Lanes implements relay.Hooks.
func (h *routeHooks) Lanes(owned int) { h.m.lanes.WithLabelValues(h.route).Set(float64(owned)) }

// WatchOutbox refreshes the backlog gauges every interval until ctx ends.
// The query counts rows (bounded by a statement timeout) rather than
// running on every scrape. It counts the states as `outbox-relay status`
// does (operator.Admin.Gauges), so that both show the same numbers.
func (m *Metrics) WatchOutbox(ctx context.Context, pool *pgxpool.Pool, schema string, interval time.Duration, log *slog.Logger) {
	a, err := operator.New(pool, schema)
	if err != nil {
		m.scrapeErrors.Inc()
		log.Error("outbox metrics check not started", "error", err)
		return
	}
	// The first count comes after a random part of the interval: relays
	// started together (after an outage, a deploy) would otherwise all
	// count the outbox at the same moment, when it is at its largest,
	// taking the database's CPU from the first relay's drain (measured:
	// 16 relays' counts of a 200k backlog took seconds of it).
	if interval > 0 {
		sleepCtx(ctx, rand.N(interval))
	}
	for ctx.Err() == nil {
		start := time.Now()
		if err := m.refresh(ctx, a); err != nil && ctx.Err() == nil {
			m.scrapeErrors.Inc()
			log.Warn("outbox metrics check failed", "error", err)
		}
		sleepCtx(ctx, refreshWait(interval, time.Since(start)))
	}
}

// countShare bounds the database time the backlog gauges take: after a
// count that took d, the next one starts no sooner than d×countShare
// after it began. The count reads the whole outbox (0.85 s of database
// time on a 1M backlog here, the most of any statement of the relay's
// drain but its claims and deletes), so on a large backlog, when the
// relays need the database most, the gauges refresh less often than
// the interval asks: at most one twentieth of one database core.
const countShare = 20

// refreshWait is the wait before the next refresh of the backlog gauges,
// every interval, or less often when the last one took long (countShare).
func refreshWait(interval, took time.Duration) time.Duration {
	return max(interval, countShare*took) - took
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (m *Metrics) refresh(ctx context.Context, a *operator.Admin) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, err := a.Gauges(ctx)
	if err != nil {
		return err
	}
	m.pending.Set(float64(t.Pending))
	m.retrying.Set(float64(t.Retrying))
	m.delayed.Set(float64(t.Delayed))
	m.oldestAge.Set(t.OldestAge.Seconds())
	m.deadLetters.Set(float64(t.DeadLetters))
	held := t.Held
	// Set the routes that hold, then delete the series of those that no
	// longer do (not Reset: a scrape in between would see no series).
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	now := map[string]bool{}
	for _, h := range held {
		now[h.Route] = true
		m.heldKeys.WithLabelValues(h.Route).Set(float64(h.Keys))
		m.oldestHold.WithLabelValues(h.Route).Set(h.OldestAge.Seconds())
	}
	for r := range m.heldRoutes {
		if !now[r] {
			m.heldKeys.DeleteLabelValues(r)
			m.oldestHold.DeleteLabelValues(r)
		}
	}
	m.heldRoutes = now
	return nil
}

// poolCollector exports pgxpool statistics.
type poolCollector struct {
	pool                                         *pgxpool.Pool
	total, idle, acquired, max, acquires, waited *prometheus.Desc
	waitDur                                      *prometheus.Desc
}

// NewPoolCollector returns a collector of pool's statistics.
func NewPoolCollector(pool *pgxpool.Pool) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(ns+"_db_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		pool:     pool,
		total:    d("connections", "Connections open in the pool."),
		idle:     d("idle_connections", "Idle connections in the pool."),
		acquired: d("acquired_connections", "Connections in use."),
		max:      d("max_connections", "Pool size limit."),
		acquires: d("acquires_total", "Connections acquired from the pool."),
		waited:   d("empty_acquires_total", "Acquires that had to wait for a connection."),
		waitDur:  d("acquire_wait_seconds_total", "Time spent waiting for a connection."),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.total, c.idle, c.acquired, c.max, c.acquires, c.waited, c.waitDur} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(s.TotalConns()))
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitDur, prometheus.CounterValue, s.AcquireDuration().Seconds())
}

// The constructors of the metrics, in the relay's namespace.

func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
}

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
}

func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help})
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, labels)
}

func newHistogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets})
}

func newHistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
}
