package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The status statements: what `outbox-relay status` and the operator API
// show. They scan the outbox, so they are for operators, not for scraping
// (metrics.go has the cheap counts). Run them in one read-only snapshot
// so that their numbers add up.

// boundedTime is a timestamp column as ages are measured: on the
// database's clock, never later than now, and now for ±infinity (a row
// edited by hand), which the relay delivers as if written now and which
// would otherwise fail the subtraction.
func boundedTime(col string) string {
	return `(CASE WHEN isfinite(` + col + `) THEN least(` + col + `, now()) ELSE now() END)`
}

// DatabaseNow is the database's clock, against which status measures
// ages and heartbeats (an operator's clock may be off).
func DatabaseNow(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	err := q.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// Backlog counts the pending messages and dead letters of one topic or
// route. Pending = Ready + Retrying + Delayed.
type Backlog struct {
	Name        string
	Pending     int64
	Ready       int64
	Retrying    int64
	Delayed     int64
	OldestAge   time.Duration
	DeadLetters int64
}

// stateCounts counts the rows of alias a by state: the columns n, ready,
// retrying, delayed, oldest. Every count on the states goes through it.
// A parked row (a dead letter holding its key) is in none of them.
func stateCounts(a string) string {
	return `count(*) FILTER (WHERE NOT ` + Parked(a) + `) n, count(*) FILTER (WHERE ` + Queued(a) + `) ready,
       count(*) FILTER (WHERE ` + Failed(a) + `) retrying, count(*) FILTER (WHERE ` + Delayed(a) + `) delayed,
       min(` + boundedTime(a+".created_at") + `) FILTER (WHERE NOT ` + Parked(a) + `) oldest`
}

const backlogColumns = `coalesce(p.n, 0), coalesce(p.ready, 0), coalesce(p.retrying, 0), coalesce(p.delayed, 0),
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, coalesce(d.n, 0)`

func scanBacklog(r pgx.CollectableRow) (Backlog, error) {
	var b Backlog
	var age float64
	err := r.Scan(&b.Name, &b.Pending, &b.Ready, &b.Retrying, &b.Delayed, &age, &b.DeadLetters)
	b.OldestAge = time.Duration(age * float64(time.Second))
	return b, err
}

func (s Schema) topicBacklogSQL() string {
	return `
SELECT coalesce(p.topic, d.topic), ` + backlogColumns + `
FROM (SELECT u.topic, ` + stateCounts("u") + `
      FROM (SELECT topic, attempts, available_at, created_at, held_since FROM ` + s.Table("messages") + `
            UNION ALL SELECT topic, attempts, available_at, created_at, held_since FROM ` + s.Table("deliveries") + `) u
      GROUP BY u.topic) p
FULL JOIN (SELECT topic, count(*) n FROM ` + s.Table("dead_letters") + ` GROUP BY topic) d ON d.topic = p.topic
ORDER BY 1`
}

// TopicBacklog returns the backlog of every topic with pending messages or
// dead letters, by topic; a fan-out copy counts once per destination.
func (s Schema) TopicBacklog(ctx context.Context, q Querier) ([]Backlog, error) {
	return collect(ctx, q, s.topicBacklogSQL(), nil, scanBacklog)
}

func (s Schema) routeBacklogSQL() string {
	return `
SELECT coalesce(p.route, d.route), ` + backlogColumns + `
FROM (SELECT c.route, ` + stateCounts("c") + `
      FROM ` + s.Table("deliveries") + ` c GROUP BY c.route) p
FULL JOIN (SELECT route, count(*) n FROM ` + s.Table("dead_letters") + ` WHERE route <> '' GROUP BY route) d ON d.route = p.route
ORDER BY 1`
}

// RouteBacklog returns the backlog of fan-out copies of every destination
// route with pending copies or dead ones, by route.
func (s Schema) RouteBacklog(ctx context.Context, q Querier) ([]Backlog, error) {
	return collect(ctx, q, s.routeBacklogSQL(), nil, scanBacklog)
}

// DeadCount counts dead letters of one topic and reason.
type DeadCount struct {
	Topic  string
	Reason string
	Count  int64
}

func (s Schema) deadByReasonSQL() string {
	return `SELECT topic, reason, count(*) FROM ` + s.Table("dead_letters") + ` GROUP BY 1, 2 ORDER BY 1, 2`
}

// DeadByReason counts dead letters by topic and reason.
func (s Schema) DeadByReason(ctx context.Context, q Querier) ([]DeadCount, error) {
	return collect(ctx, q, s.deadByReasonSQL(), nil, pgx.RowToStructByPos[DeadCount])
}

// Relay is a registered relay. StartedAt and HeartbeatAt are bounded by
// the database's clock (a time in the future reads as now; -infinity as
// the zero time).
type Relay struct {
	ID          string
	Hostname    string
	PID         int
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	Route       string
	// Lanes is how many lanes it holds an unexpired lease on.
	Lanes    int
	InFlight int
	// ConfigHash and Config are the fingerprint and the summary of the
	// route's configuration the relay registered ('' for a relay of a
	// version that does not register them).
	ConfigHash, Config string
	// DownSince is when the relay found its route's destination down (its
	// outage breaker opened), bounded by the database's clock; the zero
	// time while it delivers (or for a relay of a version that does not
	// say). DownCause is the error, DownProbes the probes that found the
	// destination still down since.
	DownSince  time.Time
	DownCause  string
	DownProbes int
	// LimitedSince is when the relay's route started waiting for its rate
	// limit or its destination (a Retry-After), bounded by the database's
	// clock; the zero time when it did not wait within its last heartbeat
	// interval. LimitCause says what it waits for.
	LimitedSince time.Time
	LimitCause   string
	// FailingSince is the first failure of the relay's current streak of
	// failing messages, bounded by the database's clock; the zero time
	// while they do not fail. LastError is the latest failure.
	FailingSince time.Time
	LastError    string
}

func (s Schema) relaysSQL() string {
	// A heartbeat in the future counts as now (relays reap such a row a
	// lease TTL later). The since columns are NULL while their state
	// does not hold.
	return `
SELECT r.id, r.hostname, r.pid, r.version, least(r.started_at, now()), least(r.heartbeat_at, now()), r.route,
       (SELECT count(*) FROM ` + s.Table("lanes") + ` l WHERE l.owner = r.id AND l.lease_until > now())::int, r.in_flight,
       r.config_hash, r.config_summary,
       CASE WHEN r.down_since IS NOT NULL THEN least(r.down_since, now()) END, coalesce(r.down_cause, ''), r.down_probes,
       CASE WHEN r.limited_since IS NOT NULL THEN least(r.limited_since, now()) END, coalesce(r.limited_cause, ''),
       CASE WHEN r.failing_since IS NOT NULL THEN least(r.failing_since, now()) END, coalesce(r.last_error, '')
FROM ` + s.Table("relays") + ` r ORDER BY r.route, r.id`
}

// Relays returns the registered relays by route and id.
func (s Schema) Relays(ctx context.Context, q Querier) ([]Relay, error) {
	return collect(ctx, q, s.relaysSQL(), nil, func(r pgx.CollectableRow) (Relay, error) {
		var x Relay
		var started, beat, down, limited, failing pgtype.Timestamptz
		err := r.Scan(&x.ID, &x.Hostname, &x.PID, &x.Version, &started, &beat, &x.Route, &x.Lanes, &x.InFlight, &x.ConfigHash, &x.Config,
			&down, &x.DownCause, &x.DownProbes, &limited, &x.LimitCause, &failing, &x.LastError)
		x.StartedAt, x.HeartbeatAt, x.DownSince = finiteOrZero(started), finiteOrZero(beat), finiteOrZero(down)
		x.LimitedSince, x.FailingSince = finiteOrZero(limited), finiteOrZero(failing)
		return x, err
	})
}

// LaneCoverage says who works the 256 lanes of one route.
type LaneCoverage struct {
	Route string
	// Relays registered for the route.
	Relays int
	// Worked lanes: leased, unexpired, by a registered relay.
	Worked int
	// Unworked lanes: 256 - Worked, missing rows included.
	Unworked int
	// Missing lane rows.
	Missing int
}

func (s Schema) laneCoverageSQL() string {
	lanes, relays := s.Table("lanes"), s.Table("relays")
	// 256 lanes per route, fixed by migration 001.
	return `
WITH routes AS (SELECT route FROM ` + lanes + ` UNION SELECT route FROM ` + relays + `),
cov AS (
    SELECT rt.route,
           (SELECT count(*) FROM ` + relays + ` r WHERE r.route = rt.route)::int AS relays,
           (SELECT count(*) FROM ` + lanes + ` l WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255)::int AS present,
           (SELECT count(*) FROM ` + lanes + ` l
            WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255 AND l.owner IS NOT NULL AND l.lease_until > now()
              AND EXISTS (SELECT 1 FROM ` + relays + ` r WHERE r.id = l.owner))::int AS worked
    FROM routes rt
)
SELECT route, relays, worked, 256 - worked, 256 - present FROM cov ORDER BY 1`
}

// LaneCoverage returns the coverage of every route that has lane rows or
// a registered relay, by route.
func (s Schema) LaneCoverage(ctx context.Context, q Querier) ([]LaneCoverage, error) {
	return collect(ctx, q, s.laneCoverageSQL(), nil, pgx.RowToStructByPos[LaneCoverage])
}

// RetryError is one error that messages still retrying failed with last:
// their topic, their fan-out route ("" for the outbox's own rows, which
// belong to whichever route takes their topic), the error text, and how
// many of the sampled rows carry it.
type RetryError struct {
	Topic string
	Route string
	Error string
	Count int64
	// FirstSeen is the earliest first failure of these messages;
	// LastSeen the latest first failure (the rows keep when a message
	// first failed, not when it last did).
	FirstSeen time.Time
	LastSeen  time.Time
	// NextAttempt is the earliest next attempt among them.
	NextAttempt time.Time
	// ExampleID is the message id of the oldest of them.
	ExampleID string
	// Sampled is true when a table held more failing rows than the scan
	// reads: the counts are of the rows due soonest.
	Sampled bool
}

// failingRows are the rows of table (alias a) that failed and are still
// pending, due soonest first, at most @scan of them. Through the partial
// index on available_at IS NOT NULL (migration 012), the statement reads
// only failing and delayed rows, however large the outbox is.
func (s Schema) failingRows(table, a, route string) string {
	return `(SELECT ` + route + ` AS route, ` + a + `.topic, ` + a + `.id, ` + a + `.message_id, ` + a + `.last_error, ` +
		a + `.first_failed_at, ` + a + `.available_at
      FROM ` + s.Table(table) + ` ` + a + `
      WHERE ` + Failed(a) + `
      ORDER BY ` + a + `.available_at LIMIT @scan)`
}

func (s Schema) retryErrorsSQL() string {
	return `
WITH f AS (
    SELECT 'm' AS src, * FROM ` + s.failingRows("messages", "m", "''") + ` x
    UNION ALL
    SELECT 'c', * FROM ` + s.failingRows("deliveries", "c", "c.route") + ` y
), sampled AS (
    SELECT src, count(*) >= @scan AS full FROM f GROUP BY src
)
SELECT f.topic, f.route, coalesce(f.last_error, ''), count(*),
       min(f.first_failed_at), max(f.first_failed_at),
       min(f.available_at), ((array_agg(f.message_id ORDER BY f.id))[1])::text,
       bool_or(sampled.full)
FROM f JOIN sampled ON sampled.src = f.src
GROUP BY f.topic, f.route, coalesce(f.last_error, '')
ORDER BY count(*) DESC, f.topic, f.route, 3
LIMIT @limit`
}

// RetryErrors returns, per topic, route and error text, the messages
// that are retrying: the most common errors first, at most limit of them,
// counted over at most scan failing rows of each table (the ones due
// soonest).
func (s Schema) RetryErrors(ctx context.Context, q Querier, scan, limit int) ([]RetryError, error) {
	return collect(ctx, q, s.retryErrorsSQL(), pgx.NamedArgs{"scan": scan, "limit": limit}, func(r pgx.CollectableRow) (RetryError, error) {
		var e RetryError
		var first, last, next pgtype.Timestamptz
		err := r.Scan(&e.Topic, &e.Route, &e.Error, &e.Count, &first, &last, &next, &e.ExampleID, &e.Sampled)
		e.FirstSeen, e.LastSeen, e.NextAttempt = finiteOrZero(first), finiteOrZero(last), finiteOrZero(next)
		return e, err
	})
}
