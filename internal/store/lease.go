package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// Leases: how relays register (the relays table, with heartbeats) and
// share a route's lanes (the lanes table, with leases). The decisions
// (the fair share, when to give lanes up) are the relay's (package
// relay/internal/lease); these are its statements.

// Leases holds the lease statements of one relay in one route, rendered
// once for a schema. The relay and the route are bound here: a relay only
// ever leases for itself, in its own route.
type Leases struct {
	relay, route string
	channel      string // the outbox's NOTIFY channel

	ensureLanes, heartbeat, clampHeartbeats, reap                stmt
	renew, countRelays                                           stmt
	workedLanes, acquire, release, releaseAll, unregister, owned stmt
	notifyMembers, notifyFreed                                   stmt
	otherConfigs                                                 stmt
}

// MembersPayload is the payload of the notification a relay sends on the
// outbox's channel when the set of relays or the lanes they hold changed
// (it joined, left, reaped a dead relay or handed lanes back): the others
// recompute their share at once instead of at their next heartbeat.
// Writers' notifications have an empty payload.
const MembersPayload = "members"

// FreedPayload is the payload of the notification a relay sends when it
// handed lanes back and the set of relays did not change: only a relay
// below its share has anything to do (take them). With sixteen relays, a
// join frees a lane at each of fifteen; as MembersPayload each of those
// made all sixteen run a heartbeat, on the database the joiner was
// waiting for.
const FreedPayload = "lanes-freed"

// Heartbeat is what a relay's registration says about it.
type Heartbeat struct {
	Hostname string
	PID      int
	Version  string
	InFlight int64 // claimed messages not yet settled
	// Pooled: the relay's sessions go through a transaction-pooling
	// proxy, so no backend is its own: its registration names none
	// (backend_pid 0), and fast failover never reaps it by backend.
	Pooled bool
	// ConfigHash fingerprints the route's configuration as this relay
	// runs it, and ConfigSummary says it for operators (redacted); see
	// OtherConfigs.
	ConfigHash, ConfigSummary string
	// Down says the route's destination is down (its outage breaker is
	// open): since DownSince (the zero time while it delivers), for
	// DownCause (the error, redacted and bounded), after DownProbes
	// probes that found it still down.
	DownSince  time.Time
	DownCause  string
	DownProbes int
	// Limited says the route waits for its rate limit or its destination:
	// since LimitedSince (the zero time while it does not), for
	// LimitCause.
	LimitedSince time.Time
	LimitCause   string
	// Failing says the route's messages fail: since FailingSince (the
	// zero time while they do not), the latest with LastError (redacted
	// and bounded).
	FailingSince time.Time
	LastError    string
}

// heartbeatArgs are the named arguments of the heartbeat statement.
func heartbeatArgs(h Heartbeat) pgx.NamedArgs {
	a := pgx.NamedArgs{
		"hostname": h.Hostname, "pid": h.PID, "version": h.Version, "in_flight": h.InFlight, "pooled": h.Pooled,
		"config_hash": h.ConfigHash, "config_summary": h.ConfigSummary,
		"down_for": nil, "down_cause": nil, "down_probes": 0,
		"limited_for": nil, "limited_cause": nil, "failing_for": nil, "last_error": nil,
	}
	// Each since goes as an age, in microseconds, which the statement
	// takes from now(): the relay sends durations, never times of its own
	// clock (a host whose clock is off must not move them).
	if !h.DownSince.IsZero() {
		a["down_for"], a["down_cause"], a["down_probes"] = age(h.DownSince), h.DownCause, h.DownProbes
	}
	if !h.LimitedSince.IsZero() {
		a["limited_for"], a["limited_cause"] = age(h.LimitedSince), h.LimitCause
	}
	if !h.FailingSince.IsZero() {
		a["failing_for"], a["last_error"] = age(h.FailingSince), h.LastError
	}
	return a
}

// age is how long ago t was, in microseconds, on the relay's monotonic
// clock.
func age(t time.Time) int64 { return max(time.Since(t), 0).Microseconds() }

// OtherConfig is a live relay of the route registered with another
// configuration than the asking relay's.
type OtherConfig struct {
	ID, Version string
	// Hash and Summary are its registration's ConfigHash and
	// ConfigSummary: both empty for a relay of a version that does not
	// register them.
	Hash, Summary string
	// Earlier: it registered before the asking relay (or the asking relay
	// is not registered).
	Earlier bool
}

// maxOtherConfigs bounds what OtherConfigs returns: enough to name them
// in a log line.
const maxOtherConfigs = 16

// RelayCount is a route's registered relays as one relay sees them.
type RelayCount struct {
	// Alive relays in the route, and Rank: how many of them have a
	// smaller id (the fair share of the lanes depends on it).
	Alive, Rank int
	// Lanes is how many lane rows the route has: NumLanes unless someone
	// deleted some.
	Lanes int
}

// NewLeases renders the lease statements of relay in route for schema s.
func NewLeases(s Schema, relay, route string) *Leases {
	l := &Leases{relay: relay, route: route, channel: ident.Channel(s.Name())}
	l.render(s)
	return l
}

// args are st's arguments: a, the relay and its route.
func (l *Leases) args(st stmt, a pgx.NamedArgs) []any {
	a["relay"], a["route"] = l.relay, l.route
	return st.args(a)
}

// EnsureLanes creates the route's lane rows that are missing (see
// QueueEnsureMissingLanes, the same statement) and returns
// how many it created.
func (l *Leases) EnsureLanes(ctx context.Context, q Querier) (int64, error) {
	tag, err := q.Exec(ctx, l.ensureLanes.sql, l.args(l.ensureLanes, pgx.NamedArgs{})...)
	return tag.RowsAffected(), err
}

// QueueEnsureMissingLanes queues on b the creation of the route's lane
// rows when some are missing. When none are (every start but the first),
// it inserts no row and so waits for no lock: an INSERT … ON CONFLICT that
// inserts nothing still waits for every transaction changing a lane row
// (the running relays' heartbeats and claims).
func (l *Leases) QueueEnsureMissingLanes(b *pgx.Batch) {
	b.Queue(l.ensureLanes.sql, l.args(l.ensureLanes, pgx.NamedArgs{})...)
}

// Heartbeat registers the relay, or renews its registration, with the
// identity of q's session (other relays reap it when that session is gone).
func (l *Leases) Heartbeat(ctx context.Context, q Querier, h Heartbeat) error {
	_, err := q.Exec(ctx, l.heartbeat.sql, l.args(l.heartbeat, heartbeatArgs(h))...)
	return err
}

// ClampHeartbeats sets the other relays' heartbeats that lie in the future
// to now.
func (l *Leases) ClampHeartbeats(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, l.clampHeartbeats.sql, l.args(l.clampHeartbeats, pgx.NamedArgs{})...)
	return err
}

// Reap unregisters the relays whose heartbeat is older than ttl or, with
// fastFailover, whose lease session is gone, and returns how many.
func (l *Leases) Reap(ctx context.Context, q Querier, ttl time.Duration, fastFailover bool) (int64, error) {
	tag, err := q.Exec(ctx, l.reap.sql, l.args(l.reap, pgx.NamedArgs{"ttl_ms": ttl.Milliseconds(), "fast_failover": fastFailover})...)
	return tag.RowsAffected(), err
}

// NotifyMembers tells the other relays (through their LISTEN) that the
// relays or their lanes changed; in a transaction, at its commit, so
// that they see the change when they hear of it. Relays send it, never
// writers, and only when something changed: rarely.
func (l *Leases) NotifyMembers(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, l.notifyMembers.sql, l.args(l.notifyMembers, pgx.NamedArgs{"channel": l.channel})...)
	return err
}

// Beat is what a heartbeat's first round trip (QueueBeat) reads back.
type Beat struct {
	// Reaped is how many dead relays were unregistered.
	Reaped int64
	// Mine are the relay's lanes, their leases renewed.
	Mine []int16
	// Count is the route's relays and lanes, this one included.
	Count RelayCount
	// Others are the route's live relays registered with another
	// configuration (see OtherConfigs).
	Others []OtherConfig
}

// QueueBeat queues on b, in one round trip, what every heartbeat does
// before it decides anything: Heartbeat, ClampHeartbeats, Reap (ttl,
// fastFailover), Renew (ttl) and CountRelays; out is filled as b's
// results are read. The caller queues BEGIN before and ends the
// transaction after: under a loaded CPU each round trip costs, and a
// relay that joins waits for two heartbeats (the others' and its own).
func (l *Leases) QueueBeat(b *pgx.Batch, h Heartbeat, ttl time.Duration, fastFailover bool, out *Beat) {
	ttlMs := ttl.Milliseconds()
	l.QueueHeartbeat(b, h)
	b.Queue(l.clampHeartbeats.sql, l.args(l.clampHeartbeats, pgx.NamedArgs{})...)
	b.Queue(l.reap.sql, l.args(l.reap, pgx.NamedArgs{"ttl_ms": ttlMs, "fast_failover": fastFailover})...).Exec(func(tag pgconn.CommandTag) error {
		out.Reaped = tag.RowsAffected()
		return nil
	})
	b.Queue(l.renew.sql, l.args(l.renew, pgx.NamedArgs{"ttl_ms": ttlMs})...).Query(func(rows pgx.Rows) error {
		var err error
		out.Mine, err = pgx.CollectRows(rows, pgx.RowTo[int16])
		return err
	})
	b.Queue(l.countRelays.sql, l.args(l.countRelays, pgx.NamedArgs{})...).QueryRow(func(r pgx.Row) error {
		return r.Scan(&out.Count.Alive, &out.Count.Rank, &out.Count.Lanes)
	})
	b.Queue(l.otherConfigs.sql, l.otherConfigsArgs(h.ConfigHash, ttl, fastFailover)...).Query(func(rows pgx.Rows) error {
		var err error
		out.Others, err = collectOtherConfigs(rows)
		return err
	})
}

// OtherConfigs returns the route's live relays (at most 16, the earliest
// registered first) whose registration's configuration hash is not hash:
// those whose heartbeat is younger than ttl and, with fastFailover, whose
// lease connection the server still has (see Reap).
func (l *Leases) OtherConfigs(ctx context.Context, q Querier, hash string, ttl time.Duration, fastFailover bool) ([]OtherConfig, error) {
	rows, err := q.Query(ctx, l.otherConfigs.sql, l.otherConfigsArgs(hash, ttl, fastFailover)...)
	if err != nil {
		return nil, err
	}
	return collectOtherConfigs(rows)
}

func (l *Leases) otherConfigsArgs(hash string, ttl time.Duration, fastFailover bool) []any {
	return l.args(l.otherConfigs, pgx.NamedArgs{"config_hash": hash, "ttl_ms": ttl.Milliseconds(), "fast_failover": fastFailover, "max": maxOtherConfigs})
}

func collectOtherConfigs(rows pgx.Rows) ([]OtherConfig, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OtherConfig, error) {
		var o OtherConfig
		err := r.Scan(&o.ID, &o.Version, &o.Hash, &o.Summary, &o.Earlier)
		return o, err
	})
}

// QueueWorkedLanes queues WorkedLanes on b; *n is set as b's results are
// read.
func (l *Leases) QueueWorkedLanes(b *pgx.Batch, n *int) {
	b.Queue(l.workedLanes.sql, l.args(l.workedLanes, pgx.NamedArgs{})...).QueryRow(func(r pgx.Row) error { return r.Scan(n) })
}

// QueueHeartbeat queues Heartbeat on b.
func (l *Leases) QueueHeartbeat(b *pgx.Batch, h Heartbeat) {
	b.Queue(l.heartbeat.sql, l.args(l.heartbeat, heartbeatArgs(h))...)
}

// QueueUnregister queues Unregister on b.
func (l *Leases) QueueUnregister(b *pgx.Batch) {
	b.Queue(l.unregister.sql, l.args(l.unregister, pgx.NamedArgs{})...)
}

// QueueRelease queues Release of lanes on b (what it released is not
// read back).
func (l *Leases) QueueRelease(b *pgx.Batch, lanes []int16) {
	b.Queue(l.release.sql, l.args(l.release, pgx.NamedArgs{"lanes": lanes})...)
}

// QueueNotifyMembers queues NotifyMembers on b.
func (l *Leases) QueueNotifyMembers(b *pgx.Batch) {
	b.Queue(l.notifyMembers.sql, l.args(l.notifyMembers, pgx.NamedArgs{"channel": l.channel})...)
}

// QueueNotifyFreed queues the notification that lanes were handed back
// (FreedPayload) on b.
func (l *Leases) QueueNotifyFreed(b *pgx.Batch) {
	b.Queue(l.notifyFreed.sql, l.args(l.notifyFreed, pgx.NamedArgs{"channel": l.channel})...)
}

// Renew extends the relay's leases by ttl and returns its lanes.
func (l *Leases) Renew(ctx context.Context, q Querier, ttl time.Duration) ([]int16, error) {
	return l.lanes(ctx, q, l.renew, pgx.NamedArgs{"ttl_ms": ttl.Milliseconds()})
}

// CountRelays counts the route's relays and lane rows.
func (l *Leases) CountRelays(ctx context.Context, q Querier) (RelayCount, error) {
	var c RelayCount
	err := q.QueryRow(ctx, l.countRelays.sql, l.args(l.countRelays, pgx.NamedArgs{})...).Scan(&c.Alive, &c.Rank, &c.Lanes)
	return c, err
}

// WorkedLanes counts the route's lanes that a live relay has leased.
func (l *Leases) WorkedLanes(ctx context.Context, q Querier) (int, error) {
	var n int
	err := q.QueryRow(ctx, l.workedLanes.sql, l.args(l.workedLanes, pgx.NamedArgs{})...).Scan(&n)
	return n, err
}

// Acquire leases up to n free lanes (unowned, expired, or owned by a relay
// no longer registered) for ttl and returns them.
func (l *Leases) Acquire(ctx context.Context, q Querier, ttl time.Duration, n int) ([]int16, error) {
	return l.lanes(ctx, q, l.acquire, pgx.NamedArgs{"ttl_ms": ttl.Milliseconds(), "n": n})
}

// Release hands lanes back and returns those it released: a lane a claim
// transaction is using right now is skipped (it goes on a later heartbeat).
func (l *Leases) Release(ctx context.Context, q Querier, lanes []int16) ([]int16, error) {
	return l.lanes(ctx, q, l.release, pgx.NamedArgs{"lanes": lanes})
}

// ReleaseAll hands every lane of the relay back.
func (l *Leases) ReleaseAll(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, l.releaseAll.sql, l.args(l.releaseAll, pgx.NamedArgs{})...)
	return err
}

// Unregister removes the relay's registration.
func (l *Leases) Unregister(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, l.unregister.sql, l.args(l.unregister, pgx.NamedArgs{})...)
	return err
}

// Owned lists the relay's lanes.
func (l *Leases) Owned(ctx context.Context, q Querier) ([]int16, error) {
	return l.lanes(ctx, q, l.owned, pgx.NamedArgs{})
}

// lanes runs st, which returns lane numbers.
func (l *Leases) lanes(ctx context.Context, q Querier, st stmt, a pgx.NamedArgs) ([]int16, error) {
	rows, err := q.Query(ctx, st.sql, l.args(st, a)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int16])
}

func (l *Leases) render(s Schema) {
	l.renderMembers(s)
	l.renderLanes(s)
}

// renderMembers renders the statements about the route's relays: their
// registration, their heartbeat, who is dead, and their configurations.
// backendGone is true of a relays row r whose lease connection is gone
// (its process died and the server noticed the closed socket), when fast
// failover is on (@fast_failover). A relay behind a transaction-pooling
// proxy names no backend (0): only its heartbeat tells.
const backendGone = `(@fast_failover AND r.backend_pid <> 0 AND NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
            WHERE a.pid = r.backend_pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start)))`

func (l *Leases) renderMembers(s Schema) {
	lanes, relays := s.Table("lanes"), s.Table("relays")
	l.ensureLanes = newStmt(`INSERT INTO ` + lanes + ` (route, lane) SELECT @route, g FROM generate_series(0, 255) AS g
WHERE (SELECT count(*) FROM ` + lanes + ` WHERE route = @route) < 256
ON CONFLICT DO NOTHING`)

	l.heartbeat = newStmt(`
INSERT INTO ` + relays + ` (id, hostname, pid, version, route, in_flight, backend_pid, backend_start, config_hash, config_summary,
    down_since, down_cause, down_probes, limited_since, limited_cause, failing_since, last_error)
SELECT @relay, @hostname, @pid, @version, @route, @in_flight,
       CASE WHEN @pooled::bool THEN 0 ELSE pg_backend_pid() END,
       CASE WHEN @pooled::bool THEN NULL ELSE a.backend_start END,
       @config_hash, @config_summary,
       now() - @down_for::bigint * interval '1 microsecond', @down_cause::text, @down_probes::int,
       now() - @limited_for::bigint * interval '1 microsecond', @limited_cause::text,
       now() - @failing_for::bigint * interval '1 microsecond', @last_error::text
FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), in_flight = EXCLUDED.in_flight,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
    down_since = EXCLUDED.down_since, down_cause = EXCLUDED.down_cause, down_probes = EXCLUDED.down_probes,
    limited_since = EXCLUDED.limited_since, limited_cause = EXCLUDED.limited_cause,
    failing_since = EXCLUDED.failing_since, last_error = EXCLUDED.last_error`)

	// Heartbeats are written with the database's now(); one in the future
	// was written by hand (or the server's clock stepped back). It is set
	// to now, so that it ages like any other: a row with heartbeat
	// 'infinity' would otherwise count as a live relay forever, and its
	// fair share of the lanes would never be worked. Locked rows are
	// skipped, as in reap.
	l.clampHeartbeats = newStmt(`
UPDATE ` + relays + ` SET heartbeat_at = now()
WHERE id IN (
    SELECT id FROM ` + relays + ` WHERE id <> @relay AND heartbeat_at > clock_timestamp()
    FOR UPDATE SKIP LOCKED)`)

	// A relay is dead when its heartbeat is older than the lease TTL or,
	// with fast failover, when its lease connection no longer exists (its
	// process died and the server noticed the closed socket). A relay
	// behind a transaction-pooling proxy names no backend (0): only its
	// heartbeat tells.
	//
	// Rows locked by another transaction are skipped: that is a relay
	// writing its heartbeat right now, alive, whose new backend pid this
	// snapshot may not show yet (after its connection was replaced).
	// Waiting for it instead deadlocked relays that all reconnected at once
	// (each one's reap waiting for the other's heartbeat), which stalled
	// whole routes in the fan-out chaos test.
	l.reap = newStmt(`
DELETE FROM ` + relays + ` WHERE id IN (
    SELECT r.id FROM ` + relays + ` r
    WHERE r.id <> @relay AND (
        r.heartbeat_at < now() - @ttl_ms * interval '1 millisecond'
        OR ` + backendGone + `)
    FOR UPDATE SKIP LOCKED)`)

	// Live: a heartbeat younger than the lease TTL and, with fast
	// failover, its lease connection still there (a dead relay not yet
	// reaped says nothing about the route's configuration now: a relay
	// killed and replaced at once by one with a corrected configuration
	// must not make the replacement wait out its heartbeat). Earlier
	// orders registrations by start, then id, so that of two relays that
	// disagree exactly one defers to the other; a relay not registered
	// yet comes after every registered one.
	l.otherConfigs = newStmt(`
SELECT r.id, r.version, r.config_hash, r.config_summary,
       (r.started_at, r.id) < (coalesce((SELECT m.started_at FROM ` + relays + ` m WHERE m.id = @relay), 'infinity'), @relay)
FROM ` + relays + ` r
WHERE r.route = @route AND r.id <> @relay AND r.config_hash <> @config_hash
  AND r.heartbeat_at > now() - @ttl_ms * interval '1 millisecond' AND NOT ` + backendGone + `
ORDER BY r.started_at, r.id
LIMIT @max`)
	l.unregister = newStmt(`DELETE FROM ` + relays + ` WHERE id = @relay`)
}

// renderLanes renders the statements about the route's lanes: their
// leases, their handover, and the notifications that tell the others.
func (l *Leases) renderLanes(s Schema) {
	lanes, relays := s.Table("lanes"), s.Table("relays")
	l.renew = newStmt(`UPDATE ` + lanes + ` SET lease_until = now() + @ttl_ms * interval '1 millisecond' WHERE route = @route AND owner = @relay RETURNING lane`)

	l.countRelays = newStmt(`SELECT count(*), count(*) FILTER (WHERE id < @relay),
    (SELECT count(*) FROM ` + lanes + ` WHERE route = @route)
FROM ` + relays + ` WHERE route = @route`)

	l.workedLanes = newStmt(`
SELECT count(*) FROM ` + lanes + ` l
WHERE l.route = @route AND l.owner IS NOT NULL AND l.lease_until > now()
  AND EXISTS (SELECT 1 FROM ` + relays + ` r WHERE r.id = l.owner)`)

	// The free lanes are picked in a materialized CTE, which runs once:
	// as an IN (subquery) the planner may choose a nested loop that
	// re-runs the locking subquery for every lane row, and then LIMIT
	// bounds each run, not the total (a relay took all 256 lanes, then
	// handed back what was over its share at the next heartbeat).
	l.acquire = newStmt(`
WITH pick AS MATERIALIZED (
    SELECT l.lane FROM ` + lanes + ` l
    WHERE l.route = @route AND (l.owner IS NULL OR l.lease_until < now()
       OR NOT EXISTS (SELECT 1 FROM ` + relays + ` r WHERE r.id = l.owner))
    ORDER BY l.lane
    LIMIT @n
    FOR UPDATE SKIP LOCKED)
UPDATE ` + lanes + ` t SET owner = @relay, lease_until = now() + @ttl_ms * interval '1 millisecond'
FROM pick
WHERE t.route = @route AND t.lane = pick.lane
RETURNING t.lane`)

	l.release = newStmt(`
UPDATE ` + lanes + ` SET owner = NULL, lease_until = NULL
WHERE lane IN (
    SELECT l.lane FROM ` + lanes + ` l WHERE l.route = @route AND l.owner = @relay AND l.lane = ANY(@lanes::int2[])
    FOR UPDATE SKIP LOCKED)
  AND route = @route
RETURNING lane`)

	l.releaseAll = newStmt(`UPDATE ` + lanes + ` SET owner = NULL, lease_until = NULL WHERE route = @route AND owner = @relay`)
	l.owned = newStmt(`SELECT lane FROM ` + lanes + ` WHERE route = @route AND owner = @relay`)
	// The channel is the writers' (the relays LISTEN on one connection);
	// the payload tells the notifications apart.
	l.notifyMembers = newStmt(`SELECT pg_notify(@channel, '` + MembersPayload + `')`)
	l.notifyFreed = newStmt(`SELECT pg_notify(@channel, '` + FreedPayload + `')`)
}
