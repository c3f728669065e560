package operator

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
)

// Status is a snapshot of the outbox for operators. Every pending message
// is in exactly one of three states, the same ones the metrics count
// (outbox_relay_*_messages): ready (deliverable now and never failed),
// retrying (failed at least once, whether or not its next attempt is due)
// and delayed (written with a delivery time still to come), so Pending =
// Ready + Retrying + Delayed.
type Status struct {
	Now time.Time `json:"now"`
	// Backlog is the whole outbox's: its DeadLetters include those of
	// fan-out copies.
	Backlog
	Topics       []TopicStatus `json:"topics"`
	DeadByReason []DeadCount   `json:"dead_letters_by_reason"`
	// FanOut is the backlog of fan-out copies per destination route.
	FanOut []RouteStatus `json:"fan_out"`
	Relays []RelayStatus `json:"relays"`
	// Routes is the delivery state of every route registered relays
	// serve, by route: whether its destination is down, it waits for a
	// rate limit, its messages fail.
	Routes []RouteHealth `json:"route_health"`
	Lanes  []LaneStatus  `json:"lanes"`
	// FreeLanes is how many lanes, over all routes, no live relay works
	// (LaneStatus.Unworked summed, missing lane rows included).
	FreeLanes int `json:"free_lanes"`
	// Mixed lists the routes whose relays run different configurations
	// (see MixedRoute).
	Mixed []MixedRoute `json:"mixed_configs,omitempty"`
	// Held counts, per route with the hold policy, the keys its dead
	// letters hold; Holds lists the oldest holds (at most MaxHolds).
	Held  []HeldStatus `json:"held"`
	Holds []Hold       `json:"holds"`
	// RetryErrors says why messages retry: the last error of the retrying
	// messages per topic and route, the most common first (at most
	// MaxRetryErrors, counted over at most RetryErrorScan failing rows of
	// the outbox and as many of the fan-out copies).
	RetryErrors []RetryError `json:"retry_errors"`
}

// MaxRetryErrors is how many errors Status lists; RetryErrorScan how
// many failing rows of each table it reads to find them (the ones due
// soonest), which bounds its cost on a large outbox.
const (
	MaxRetryErrors = 20
	RetryErrorScan = 10000
)

// RetryError is the last error of some retrying messages of one topic and
// route (route "" for the outbox's own rows; a fan-out route's name for
// its copies).
type RetryError struct {
	Topic string `json:"topic"`
	Route string `json:"route"`
	Error string `json:"error"`
	// Count is how many retrying messages failed last with it.
	Count int64 `json:"count"`
	// FirstSeen is the earliest first failure of these messages, LastSeen
	// the latest (a message keeps when it first failed).
	FirstSeen time.Time `json:"first_seen_at"`
	LastSeen  time.Time `json:"last_seen_at"`
	// NextAttempt is the earliest next attempt among them.
	NextAttempt time.Time `json:"next_attempt_at"`
	// ExampleID is the message id (what consumers see) of the oldest.
	ExampleID string `json:"example_message_id"`
	// Sampled is true when more messages were failing than the scan
	// reads: Count is then a lower bound.
	Sampled bool `json:"sampled"`
}

// MaxHolds is how many holds Status lists.
const MaxHolds = 100

// HeldStatus is how many keys one route holds (route "" is the relay
// without a routes table) and the age of its oldest hold.
type HeldStatus struct {
	Route     string        `json:"route"`
	Keys      int64         `json:"keys"`
	OldestAge time.Duration `json:"oldest_hold_age_ns"`
}

// Hold is one held key: the dead letter (ID, Route: as in DeadLetter)
// that holds it since Since, and the pending messages of the key behind
// it. Replaying the dead letter delivers it first, then them; purging it
// lets them go.
type Hold struct {
	Route  string    `json:"route"`
	Key    string    `json:"key"`
	ID     int64     `json:"dead_letter_id"`
	Since  time.Time `json:"since"`
	Behind int64     `json:"behind"`
}

// LaneStatus says who works the 256 lanes of one route (every route that
// has lane rows or a live relay). A lane is worked when a relay in the
// relays table holds an unexpired lease on it. Its messages wait while it
// is not: briefly when a relay dies or hands lanes over, for good when
// lane rows are missing or a dead relay is still registered (relays
// repair both at their heartbeats, the second after a lease TTL).
type LaneStatus struct {
	Route string `json:"route"`
	// Relays registered for the route.
	Relays int `json:"relays"`
	// Worked lanes: leased by a registered relay.
	Worked int `json:"worked"`
	// Unworked lanes: 256 - Worked, missing rows included.
	Unworked int `json:"unworked"`
	// Missing lane rows (deleted by hand): no relay can lease those lanes
	// until a relay of the route creates them again.
	Missing int `json:"missing"`
}

// Backlog is the pending messages and dead letters of one topic or route,
// by state (see Status).
type Backlog struct {
	Pending     int64         `json:"pending"`
	Ready       int64         `json:"ready"`
	Retrying    int64         `json:"retrying"`
	Delayed     int64         `json:"delayed"`
	OldestAge   time.Duration `json:"oldest_pending_age_ns"`
	DeadLetters int64         `json:"dead_letters"`
}

// RouteStatus is the backlog of fan-out copies of one destination route.
type RouteStatus struct {
	Route string `json:"route"`
	Backlog
}

// TopicStatus is the backlog of one topic (fan-out copies count once per
// destination).
type TopicStatus struct {
	Topic string `json:"topic"`
	Backlog
}

// DeadCount counts dead letters by topic and reason.
type DeadCount struct {
	Topic  string `json:"topic"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// RelayStatus is one registered relay. StartedAt and HeartbeatAt are
// bounded by the database's clock (a time in the future shows as now; the
// zero time stands for -infinity).
type RelayStatus struct {
	ID          string    `json:"id"`
	Hostname    string    `json:"hostname"`
	PID         int       `json:"pid"`
	Version     string    `json:"version"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Route       string    `json:"route"`
	Lanes       int       `json:"lanes"`
	InFlight    int       `json:"in_flight"`
	// ConfigHash fingerprints the route's configuration the relay runs
	// (its topics, sink, format, dead-letter policy, fan-out), and Config
	// says it, secrets redacted; both empty for a relay of a version that
	// does not register them.
	ConfigHash string `json:"config_hash"`
	Config     string `json:"config"`
	// Delivery is the relay's route's state at its last heartbeat (see
	// RouteHealth).
	Delivery
}

// Route delivery states (Delivery.State), from the best. A relay in
// several states reports the worst: DestinationDown, then RateLimited,
// then Degraded.
const (
	// Delivering is the healthy state: the relay delivers (or has nothing
	// to deliver).
	Delivering = "delivering"
	// Degraded: the relay delivers, but messages of its route failed and
	// counted an attempt (retried or dead-lettered) since the first
	// failure of the streak (FailingSince); a heartbeat interval with
	// deliveries and no failure makes it healthy again.
	Degraded = "degraded"
	// RateLimited: within its last heartbeat interval the relay waited
	// for its route's rate limit (run --rate-limit) or for its
	// destination, which asked it to slow down (a Retry-After), since
	// LimitedSince.
	RateLimited = "rate_limited"
	// DestinationDown: the relay found its route's destination down as a
	// whole (its outage breaker is open) and claims only one message at
	// a time, as a probe, until one gets through.
	DestinationDown = "destination_down"
)

// Delivery is the state of a route's delivery as a relay sees it
// (docs/operations.md, "Route health"), written with each heartbeat:
// whether its outage breaker is open (docs/guarantees.md, "Sink outages
// cost no attempts"), whether it waits for a rate limit, whether its
// messages fail. A relay of a version that does not report a state reads
// as not in it.
type Delivery struct {
	// State is the worst state that holds: DestinationDown, RateLimited,
	// Degraded, or else Delivering.
	State string `json:"state"`
	// DownSince is when the destination was found down, bounded by the
	// database's clock (null while it is not).
	DownSince *time.Time `json:"down_since"`
	// DownCause is the error that found it down, or the latest probe's
	// (redacted by the sink, at most 500 characters; "" while it is not).
	DownCause string `json:"down_cause"`
	// DownProbes counts the probes that found it still down.
	DownProbes int `json:"down_probes"`
	// LimitedSince is when the route started waiting for its rate limit
	// or its destination (null while it does not), and LimitCause says
	// what for: "rate limit 50/s (burst 50)", or the error that carried
	// the Retry-After.
	LimitedSince *time.Time `json:"limited_since"`
	LimitCause   string     `json:"limit_cause"`
	// FailingSince is the first failure of the route's current streak of
	// failing messages (null while they do not fail), and LastError the
	// latest (redacted by the sink, at most 500 characters).
	FailingSince *time.Time `json:"failing_since"`
	LastError    string     `json:"last_error"`
}

// Down reports whether the destination is down.
func (d Delivery) Down() bool { return d.State == DestinationDown }

// Since is when the state (State) began; nil while delivering.
func (d Delivery) Since() *time.Time {
	switch d.State {
	case DestinationDown:
		return d.DownSince
	case RateLimited:
		return d.LimitedSince
	case Degraded:
		return d.FailingSince
	}
	return nil
}

// Cause says why the route is in its state; "" while delivering.
func (d Delivery) Cause() string {
	switch d.State {
	case DestinationDown:
		return d.DownCause
	case RateLimited:
		return d.LimitCause
	case Degraded:
		return d.LastError
	}
	return ""
}

// state is the worst state d's fields say holds.
func (d Delivery) state() string {
	switch {
	case d.DownSince != nil:
		return DestinationDown
	case d.LimitedSince != nil:
		return RateLimited
	case d.FailingSince != nil:
		return Degraded
	}
	return Delivering
}

// RouteHealth is the delivery state of one route that registered relays
// serve, the worst of its relays' (DestinationDown when one of them finds
// its destination down, and so on). For each state it holds the earliest
// since of its relays in it, with that relay's cause, and the most
// probes any of them counted.
type RouteHealth struct {
	Route string `json:"route"`
	// Relays registered for the route, and how many of them find its
	// destination down, wait for a rate limit, see messages fail.
	Relays        int `json:"relays"`
	RelaysDown    int `json:"relays_down"`
	RelaysLimited int `json:"relays_rate_limited"`
	RelaysFailing int `json:"relays_degraded"`
	Delivery
}

func relayStatus(r store.Relay) RelayStatus {
	s := RelayStatus{ID: r.ID, Hostname: r.Hostname, PID: r.PID, Version: r.Version, StartedAt: r.StartedAt,
		HeartbeatAt: r.HeartbeatAt, Route: r.Route, Lanes: r.Lanes, InFlight: r.InFlight, ConfigHash: r.ConfigHash, Config: r.Config}
	d := &s.Delivery
	if !r.DownSince.IsZero() {
		d.DownSince, d.DownCause, d.DownProbes = ptr(r.DownSince), r.DownCause, r.DownProbes
	}
	if !r.LimitedSince.IsZero() {
		d.LimitedSince, d.LimitCause = ptr(r.LimitedSince), r.LimitCause
	}
	if !r.FailingSince.IsZero() {
		d.FailingSince, d.LastError = ptr(r.FailingSince), r.LastError
	}
	d.State = d.state()
	return s
}

func ptr[T any](v T) *T { return &v }

// routeHealth sums the relays' delivery states per route, by route.
func routeHealth(relays []RelayStatus) []RouteHealth {
	out := []RouteHealth{}
	at := map[string]int{}
	for _, r := range relays {
		i, ok := at[r.Route]
		if !ok {
			i = len(out)
			at[r.Route] = i
			out = append(out, RouteHealth{Route: r.Route, Delivery: Delivery{State: Delivering}})
		}
		out[i].add(r.Delivery)
	}
	return out
}

// add merges the delivery state of one more relay of the route into h.
func (h *RouteHealth) add(r Delivery) {
	h.Relays++
	d := &h.Delivery
	if r.DownSince != nil {
		h.RelaysDown++
		if earlier(r.DownSince, d.DownSince) {
			d.DownSince, d.DownCause = r.DownSince, r.DownCause
		}
		d.DownProbes = max(d.DownProbes, r.DownProbes)
	}
	if r.LimitedSince != nil {
		h.RelaysLimited++
		if earlier(r.LimitedSince, d.LimitedSince) {
			d.LimitedSince, d.LimitCause = r.LimitedSince, r.LimitCause
		}
	}
	if r.FailingSince != nil {
		h.RelaysFailing++
		if earlier(r.FailingSince, d.FailingSince) {
			d.FailingSince, d.LastError = r.FailingSince, r.LastError
		}
	}
	d.State = d.state()
}

// earlier reports whether a is before b, a nil b being after everything.
func earlier(a, b *time.Time) bool { return b == nil || a.Before(*b) }

// MixedRoute is a route whose registered relays run different
// configurations: allowed during a rolling change (run
// --allow-config-change), a mistake otherwise.
type MixedRoute struct {
	Route   string        `json:"route"`
	Configs []RouteConfig `json:"configs"`
}

// RouteConfig is one configuration of a route (RelayStatus.Config) and
// the relays that run it.
type RouteConfig struct {
	Config string   `json:"config"`
	Relays []string `json:"relays"`
}

// mixedRoutes finds the routes whose relays registered more than one
// configuration (relays that registered none are left out). Hashes of
// different encodings (the prefix before ":", which a release changes when
// it changes what the fingerprint covers) are not compared: during such an
// upgrade, relays of one configuration register two hashes, as the relays
// themselves know.
func mixedRoutes(relays []RelayStatus) []MixedRoute {
	var all []MixedRoute
	route := map[[2]string]int{}
	config := map[[2]string]int{}
	for _, r := range relays {
		if r.ConfigHash == "" {
			continue
		}
		encoding, _, _ := strings.Cut(r.ConfigHash, ":")
		i, ok := route[[2]string{r.Route, encoding}]
		if !ok {
			i = len(all)
			route[[2]string{r.Route, encoding}] = i
			all = append(all, MixedRoute{Route: r.Route})
		}
		m := &all[i]
		j, ok := config[[2]string{r.Route, r.ConfigHash}]
		if !ok {
			j = len(m.Configs)
			config[[2]string{r.Route, r.ConfigHash}] = j
			m.Configs = append(m.Configs, RouteConfig{Config: r.Config})
		}
		m.Configs[j].Relays = append(m.Configs[j].Relays, r.ID)
	}
	var mixed []MixedRoute
	for _, m := range all {
		if len(m.Configs) > 1 {
			mixed = append(mixed, m)
		}
	}
	return mixed
}

func (b *Backlog) add(o Backlog) {
	b.Pending += o.Pending
	b.Ready += o.Ready
	b.Retrying += o.Retrying
	b.Delayed += o.Delayed
	b.DeadLetters += o.DeadLetters
	b.OldestAge = max(b.OldestAge, o.OldestAge)
}

func backlog(b store.Backlog) Backlog {
	return Backlog{Pending: b.Pending, Ready: b.Ready, Retrying: b.Retrying, Delayed: b.Delayed,
		OldestAge: b.OldestAge, DeadLetters: b.DeadLetters}
}

// Status reads the backlog per topic and route, dead letters, relays and
// lanes, in one read-only snapshot. It scans the outbox, so it is for
// operators, not for scraping every second (the metrics are).
func (a *Admin) Status(ctx context.Context) (Status, error) {
	var st Status
	err := pgx.BeginTxFunc(ctx, a.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return a.status(ctx, tx, &st)
	})
	if err != nil {
		return Status{}, ident.SchemaMissing(fmt.Errorf("outbox: status: %w", err), a.schema.Name())
	}
	return st, nil
}

func (a *Admin) status(ctx context.Context, tx pgx.Tx, st *Status) error {
	s := a.schema
	var err error
	if st.Now, err = store.DatabaseNow(ctx, tx); err != nil {
		return err
	}
	topics, err := s.TopicBacklog(ctx, tx)
	if err != nil {
		return err
	}
	st.Topics = convert(topics, func(t store.Backlog) TopicStatus { return TopicStatus{Topic: t.Name, Backlog: backlog(t)} })
	for _, t := range st.Topics {
		st.Backlog.add(t.Backlog)
	}
	dead, err := s.DeadByReason(ctx, tx)
	if err != nil {
		return err
	}
	st.DeadByReason = convert(dead, func(d store.DeadCount) DeadCount { return DeadCount(d) })
	routes, err := s.RouteBacklog(ctx, tx)
	if err != nil {
		return err
	}
	st.FanOut = convert(routes, func(r store.Backlog) RouteStatus { return RouteStatus{Route: r.Name, Backlog: backlog(r)} })
	relays, err := s.Relays(ctx, tx)
	if err != nil {
		return err
	}
	st.Relays = convert(relays, relayStatus)
	st.Routes = routeHealth(st.Relays)
	st.Mixed = mixedRoutes(st.Relays)
	lanes, err := s.LaneCoverage(ctx, tx)
	if err != nil {
		return err
	}
	st.Lanes = convert(lanes, func(l store.LaneCoverage) LaneStatus { return LaneStatus(l) })
	for _, l := range lanes {
		st.FreeLanes += l.Unworked
	}
	held, err := s.HeldRoutes(ctx, tx)
	if err != nil {
		return err
	}
	st.Held = convert(held, func(h store.HeldRoute) HeldStatus { return HeldStatus(h) })
	holds, err := s.Holds(ctx, tx, MaxHolds)
	if err != nil {
		return err
	}
	st.Holds = convert(holds, func(h store.Hold) Hold { return Hold(h) })
	errs, err := s.RetryErrors(ctx, tx, RetryErrorScan, MaxRetryErrors)
	if err != nil {
		return err
	}
	st.RetryErrors = convert(errs, func(e store.RetryError) RetryError { return RetryError(e) })
	return nil
}

// convert maps the store's rows to the API's types. An empty list stays
// a list ([] in JSON, not null): a console iterates it.
func convert[T, U any](rows []T, f func(T) U) []U {
	out := make([]U, len(rows))
	for i, r := range rows {
		out[i] = f(r)
	}
	return out
}

// Topics returns the backlog of every topic with pending messages or dead
// letters: the part of Status that the console samples for its charts.
func (a *Admin) Topics(ctx context.Context) ([]TopicStatus, error) {
	topics, err := a.schema.TopicBacklog(ctx, a.pool)
	if err != nil {
		return nil, ident.SchemaMissing(fmt.Errorf("outbox: topic backlog: %w", err), a.schema.Name())
	}
	return convert(topics, func(t store.Backlog) TopicStatus { return TopicStatus{Topic: t.Name, Backlog: backlog(t)} }), nil
}
