package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/outbox"
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
	// serve, by route: whether its destination is down.
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
	// Delivery is what the relay's outage breaker says of its route's
	// destination at its last heartbeat (see RouteHealth).
	Delivery
}

// Route delivery states (Delivery.State).
const (
	// Delivering: the relay delivers (or has nothing to deliver).
	Delivering = "delivering"
	// DestinationDown: the relay found its route's destination down as a
	// whole (its outage breaker is open) and claims only one message at
	// a time, as a probe, until one gets through.
	DestinationDown = "destination_down"
)

// Delivery is the state of a route's delivery as a relay's outage breaker
// sees it (docs/guarantees.md, "Sink outages cost no attempts"), written
// with each heartbeat. A relay of a version that does not report it
// reads as delivering.
type Delivery struct {
	// State is Delivering or DestinationDown.
	State string `json:"state"`
	// DownSince is when the destination was found down, bounded by the
	// database's clock (null while delivering).
	DownSince *time.Time `json:"down_since"`
	// DownCause is the error that found it down, or the latest probe's
	// (redacted by the sink, at most 500 characters; "" while delivering).
	DownCause string `json:"down_cause"`
	// DownProbes counts the probes that found it still down.
	DownProbes int `json:"down_probes"`
}

// Down reports whether the destination is down.
func (d Delivery) Down() bool { return d.State == DestinationDown }

// RouteHealth is the delivery state of one route that registered relays
// serve: down when one of them finds its destination down (the earliest
// such relay's since and cause, the most probes any of them counted).
type RouteHealth struct {
	Route string `json:"route"`
	// Relays registered for the route, and how many of them find its
	// destination down.
	Relays     int `json:"relays"`
	RelaysDown int `json:"relays_down"`
	Delivery
}

func relayStatus(r store.Relay) RelayStatus {
	s := RelayStatus{ID: r.ID, Hostname: r.Hostname, PID: r.PID, Version: r.Version, StartedAt: r.StartedAt,
		HeartbeatAt: r.HeartbeatAt, Route: r.Route, Lanes: r.Lanes, InFlight: r.InFlight, ConfigHash: r.ConfigHash, Config: r.Config,
		Delivery: Delivery{State: Delivering}}
	if !r.DownSince.IsZero() {
		since := r.DownSince
		s.Delivery = Delivery{State: DestinationDown, DownSince: &since, DownCause: r.DownCause, DownProbes: r.DownProbes}
	}
	return s
}

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
		h := &out[i]
		h.Relays++
		if !r.Down() {
			continue
		}
		h.RelaysDown++
		probes := max(h.DownProbes, r.DownProbes)
		if !h.Down() || r.DownSince.Before(*h.DownSince) {
			h.Delivery = r.Delivery
		}
		h.DownProbes = probes
	}
	return out
}

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
// configuration (relays that registered none are left out).
func mixedRoutes(relays []RelayStatus) []MixedRoute {
	var all []MixedRoute
	route := map[string]int{}
	config := map[[2]string]int{}
	for _, r := range relays {
		if r.ConfigHash == "" {
			continue
		}
		i, ok := route[r.Route]
		if !ok {
			i = len(all)
			route[r.Route] = i
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
		return Status{}, outbox.SchemaMissing(fmt.Errorf("outbox: status: %w", err), a.schema.Name())
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
		return nil, outbox.SchemaMissing(fmt.Errorf("outbox: topic backlog: %w", err), a.schema.Name())
	}
	return convert(topics, func(t store.Backlog) TopicStatus { return TopicStatus{Topic: t.Name, Backlog: backlog(t)} }), nil
}
