package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The operator's statements: dead letters (list, show, replay, purge) and
// the replay of the archive. The decisions around them (what an empty
// selection means, why a dead letter was skipped) belong to package
// relay/operator; here is only what the database does.

// DeadLetterFilter selects dead letters. A zero field does not filter; the
// zero filter selects every dead letter.
type DeadLetterFilter struct {
	IDs   []int64
	Topic string
	// Key is the message key (a dead letter without a key never matches).
	Key    string
	Reason string
	// Route is a fan-out destination ("" does not filter: a dead letter of
	// the outbox itself has the route '', which DefaultRoute selects).
	Route string
	// DefaultRoute selects only the dead letters of the outbox itself
	// (route ''), not those of fan-out copies. Route must then be "".
	DefaultRoute bool
	DeadBefore   time.Time
	// DeadAfter selects dead letters that died at or after it.
	DeadAfter time.Time
	// OlderThan is measured on the database's clock.
	OlderThan time.Duration
}

func (f DeadLetterFilter) args() pgx.NamedArgs {
	a := pgx.NamedArgs{"ids": nil, "topic": nil, "key": nil, "reason": nil, "dead_before": nil, "dead_after": nil, "older_ms": nil, "route": nil}
	if len(f.IDs) > 0 {
		a["ids"] = f.IDs
	}
	if f.Topic != "" {
		a["topic"] = f.Topic
	}
	if f.Key != "" {
		a["key"] = f.Key
	}
	if f.Reason != "" {
		a["reason"] = f.Reason
	}
	if !f.DeadBefore.IsZero() {
		a["dead_before"] = f.DeadBefore
	}
	if !f.DeadAfter.IsZero() {
		a["dead_after"] = f.DeadAfter
	}
	if f.OlderThan > 0 {
		a["older_ms"] = f.OlderThan.Milliseconds()
	}
	if f.Route != "" || f.DefaultRoute {
		a["route"] = f.Route
	}
	return a
}

// Dead-letter reasons: the values of dead_letters.reason.
const (
	// ReasonPermanent: the sink refused the message for good.
	ReasonPermanent = "permanent"
	// ReasonMaxAttempts: the message failed its last allowed attempt.
	ReasonMaxAttempts = "max_attempts"
)

// DeadLetterReasons lists every reason the relay writes, for the
// operator's selections to refuse a reason that can select nothing.
var DeadLetterReasons = []string{ReasonMaxAttempts, ReasonPermanent}

// deadLetterWhere is DeadLetterFilter's condition (its arguments: args).
const deadLetterWhere = ` WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)`

// DeadLetter is a row of dead_letters. Timestamps that are not finite
// (edited by hand) read as the zero time, or nil.
type DeadLetter struct {
	ID            int64
	MessageID     string
	Topic         string
	Key           *string
	Payload       []byte
	Headers       map[string]string
	CreatedAt     time.Time
	Attempts      int
	Reason        string
	Route         string
	FirstError    *string
	LastError     *string
	FirstFailedAt *time.Time
	DeadAt        time.Time
	// Holds: the dead letter holds its key (the hold policy); Behind
	// counts the pending messages of its key after it. Read by
	// ListDeadLetters only.
	Holds  bool
	Behind int64
}

// DeadLetterKey is the key of a dead letter: a message id and the fan-out
// route its copy died on ("" for the outbox).
type DeadLetterKey struct {
	ID    int64
	Route string
}

const deadLetterColumns = `id, message_id::text, topic, key, payload, headers, created_at, attempts, reason, route, first_error, last_error, first_failed_at, dead_at`

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	var created, firstFailed, dead pgtype.Timestamptz
	err := row.Scan(&d.ID, &d.MessageID, &d.Topic, &d.Key, &d.Payload, &d.Headers, &created, &d.Attempts,
		&d.Reason, &d.Route, &d.FirstError, &d.LastError, &firstFailed, &dead)
	d.CreatedAt, d.FirstFailedAt, d.DeadAt = finiteOrZero(created), finiteOrNil(firstFailed), finiteOrZero(dead)
	return d, err
}

// finiteOrZero reads a timestamp column that a hand edit may have set to
// ±infinity, which pgx refuses to scan into a time.Time: one such row
// must not break an operator's listing.
func finiteOrZero(ts pgtype.Timestamptz) time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return ts.Time
}

// finiteOrNil is finiteOrZero for a nullable column.
func finiteOrNil(ts pgtype.Timestamptz) *time.Time {
	if t := finiteOrZero(ts); !t.IsZero() {
		return &t
	}
	return nil
}

// collect runs a query with its named arguments (nil: none) and scans
// every row with scan.
func collect[T any](ctx context.Context, q Querier, sql string, args pgx.NamedArgs, scan pgx.RowToFunc[T]) ([]T, error) {
	rows, err := q.Query(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

func (s Schema) listDeadLettersSQL() string {
	return `SELECT ` + deadLetterColumns + `, ` + s.holdColumns("x") + ` FROM (
    SELECT * FROM ` + s.Table("dead_letters") + deadLetterWhere + `
      AND (id, route) > (@after_id, @after_route)
    ORDER BY id, route LIMIT @limit
) x
ORDER BY id, route`
}

// holdColumns are, for the dead letter of alias a, whether it holds its
// key and how many pending messages of the key wait behind it (in its
// table: the outbox, or its route's copies; through the lane index).
func (s Schema) holdColumns(a string) string {
	msgs, copies := s.Table("messages"), s.Table("deliveries")
	lane := s.quoted + `.lane_of(` + a + `.key, ` + a + `.id)`
	return s.parkedFor(a) + ` AS holds,
    CASE WHEN ` + a + `.key IS NULL THEN 0
         WHEN ` + a + `.route = '' THEN (SELECT count(*) FROM ` + msgs + ` w
             WHERE w.lane = ` + lane + ` AND w.key = ` + a + `.key AND w.id > ` + a + `.id AND NOT ` + Parked("w") + `)
         ELSE (SELECT count(*) FROM ` + copies + ` w
             WHERE w.route = ` + a + `.route AND w.lane = ` + lane + ` AND w.key = ` + a + `.key AND w.id > ` + a + `.id AND NOT ` + Parked("w") + `)
    END AS behind`
}

// ListDeadLetters returns at most limit dead letters of f that come after
// the key after, in (id, route) order: a page, the next of which starts
// after its last row.
func (s Schema) ListDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, after DeadLetterKey, limit int) ([]DeadLetter, error) {
	args := f.args()
	args["after_id"], args["after_route"], args["limit"] = after.ID, after.Route, limit
	return collect(ctx, q, s.listDeadLettersSQL(), args, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var created, firstFailed, dead pgtype.Timestamptz
		err := row.Scan(&d.ID, &d.MessageID, &d.Topic, &d.Key, &d.Payload, &d.Headers, &created, &d.Attempts,
			&d.Reason, &d.Route, &d.FirstError, &d.LastError, &firstFailed, &dead, &d.Holds, &d.Behind)
		d.CreatedAt, d.FirstFailedAt, d.DeadAt = finiteOrZero(created), finiteOrNil(firstFailed), finiteOrZero(dead)
		return d, err
	})
}

func (s Schema) deadLettersOfSQL() string {
	return `SELECT ` + deadLetterColumns + ` FROM ` + s.Table("dead_letters") + ` WHERE id = @id ORDER BY route`
}

// DeadLettersOf returns the dead letters of message id: one, or one per
// fan-out route whose copy died; none when it has no dead letter.
func (s Schema) DeadLettersOf(ctx context.Context, q Querier, id int64) ([]DeadLetter, error) {
	return collect(ctx, q, s.deadLettersOfSQL(), pgx.NamedArgs{"id": id}, scanDeadLetter)
}

func (s Schema) countDeadLettersSQL() string {
	return `SELECT count(*) FROM ` + s.Table("dead_letters") + deadLetterWhere
}

// CountDeadLetters counts the dead letters of f.
func (s Schema) CountDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, s.countDeadLettersSQL(), f.args()).Scan(&n)
	return n, err
}

func (s Schema) purgeDeadLettersSQL() string {
	// The schema's trigger on dead_letters deletes the parked rows of the
	// purged dead letters once the statement is done (migration 011); the
	// count reads them before, in the statement's snapshot.
	return `
WITH gone AS (
    DELETE FROM ` + s.Table("dead_letters") + deadLetterWhere + `
    RETURNING id, route
)
SELECT count(*), count(*) FILTER (WHERE ` + s.parkedFor("gone") + `) FROM gone`
}

// parkedFor is true when the dead letter of alias a (id, route) has a
// parked row: it holds its key (the hold policy).
func (s Schema) parkedFor(a string) string {
	return `CASE WHEN ` + a + `.route = '' THEN EXISTS (SELECT 1 FROM ` + s.Table("messages") + ` h WHERE h.id = ` + a + `.id AND ` + Parked("h") + `)
    ELSE EXISTS (SELECT 1 FROM ` + s.Table("deliveries") + ` h WHERE h.route = ` + a + `.route AND h.id = ` + a + `.id AND ` + Parked("h") + `) END`
}

// PurgeDeadLetters deletes the dead letters of f and returns how many, and
// how many of them held their key (the hold policy), now released.
func (s Schema) PurgeDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter) (purged, released int64, err error) {
	err = q.QueryRow(ctx, s.purgeDeadLettersSQL(), f.args()).Scan(&purged, &released)
	return purged, released, err
}

// Replay outcomes as the replay statements report them.
const (
	OutcomeReplayed        = "replayed"
	OutcomeReplayedWithout = "replayed_without_dedup_key"
	OutcomeSkipped         = "skipped"
)

// ReplayedRow is what a replay did, or in a plan would do, with one dead
// letter, and what stood in its way.
type ReplayedRow struct {
	ID        int64
	Route     string
	MessageID string
	DedupKey  *string
	// Outcome is one of the Outcome constants.
	Outcome string
	// KeyHolder is the message id of the pending message holding the
	// dead letter's dedup key (when it was visible to the statement).
	KeyHolder *string
	// RunHolder is the id of an older dead letter of the same run that
	// took the dedup key.
	RunHolder *int64
	// IDPending: the message (for a copy: its copy for that route) is
	// pending already.
	IDPending bool
	// Busy: another transaction held the dead letter.
	Busy bool
}

const replayColumns = `id, route, message_id, dedup_key, outcome, key_holder, run_holder, id_pending, busy`

func scanReplayed(row pgx.CollectableRow) (ReplayedRow, error) {
	var r ReplayedRow
	err := row.Scan(&r.ID, &r.Route, &r.MessageID, &r.DedupKey, &r.Outcome, &r.KeyHolder, &r.RunHolder, &r.IDPending, &r.Busy)
	return r, err
}

// unpark is what a replay sets on a parked row (the hold policy): deliverable
// now, with a fresh attempt count, like a dead letter inserted again. It
// keeps its id, so it goes before the messages its key held back.
const unpark = `available_at = NULL, held_since = NULL, attempts = 0, first_error = NULL, last_error = NULL, first_failed_at = NULL`

func (s Schema) replayDeadLettersSQL() string {
	dl, msgs, copies := s.Table("dead_letters"), s.Table("messages"), s.Table("deliveries")
	return `
WITH picked AS MATERIALIZED (
    SELECT id, route FROM ` + dl + deadLetterWhere + `
), sel AS MATERIALIZED (
    SELECT id, route FROM ` + dl + deadLetterWhere + ` ORDER BY id, route FOR UPDATE SKIP LOCKED
), d AS MATERIALIZED (
    SELECT dl.* FROM ` + dl + ` dl JOIN sel USING (id, route)
), unparked AS (
    UPDATE ` + msgs + ` m SET ` + unpark + `, held_route = NULL
    FROM d WHERE d.route = '' AND m.id = d.id AND ` + Parked("m") + `
    RETURNING m.id
), unparked_copies AS (
    UPDATE ` + copies + ` m SET ` + unpark + `
    FROM d WHERE d.route <> '' AND m.route = d.route AND m.id = d.id AND ` + Parked("m") + `
    RETURNING m.route, m.id
), outbox AS (
    INSERT INTO ` + msgs + ` (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, dedup_key, priority FROM d
    WHERE route = '' AND id NOT IN (SELECT id FROM unparked) ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), cleared AS (
    INSERT INTO ` + msgs + ` (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, NULL, priority FROM d
    WHERE @clear_keys AND route = '' AND dedup_key IS NOT NULL AND id NOT IN (SELECT id FROM outbox)
      AND id NOT IN (SELECT id FROM unparked) ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), copies AS (
    INSERT INTO ` + copies + ` (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
    SELECT route, id, message_id, topic, key, payload, headers, ` + s.quoted + `.lane_of(key, id), created_at, dedup_key, priority FROM d
    WHERE route <> '' AND (route, id) NOT IN (SELECT route, id FROM unparked_copies) ORDER BY id
    ON CONFLICT (route, id) DO NOTHING
    RETURNING route, id
), done AS MATERIALIZED (
    SELECT id, '' AS route, 'replayed' AS outcome FROM outbox
    UNION ALL SELECT id, '', 'replayed_without_dedup_key' FROM cleared
    UNION ALL SELECT id, route, 'replayed' FROM copies
    UNION ALL SELECT id, '', 'replayed' FROM unparked
    UNION ALL SELECT id, route, 'replayed' FROM unparked_copies
), gone AS (
    DELETE FROM ` + dl + ` dl USING done WHERE dl.id = done.id AND dl.route = done.route
)
SELECT ` + replayColumns + ` FROM (
    SELECT p.id, p.route, dl.message_id::text AS message_id, dl.dedup_key,
           coalesce(done.outcome, 'skipped') AS outcome,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT m.message_id::text FROM ` + msgs + ` m WHERE m.dedup_key = dl.dedup_key AND m.id <> p.id) END AS key_holder,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT min(x.id) FROM d x WHERE x.route = '' AND x.dedup_key = dl.dedup_key AND x.id < p.id
                  AND x.id IN (SELECT id FROM outbox)) END AS run_holder,
           done.id IS NULL AND CASE WHEN p.route = '' THEN EXISTS (SELECT 1 FROM ` + msgs + ` m WHERE m.id = p.id AND NOT ` + Parked("m") + `)
               ELSE EXISTS (SELECT 1 FROM ` + copies + ` c WHERE c.route = p.route AND c.id = p.id AND NOT ` + Parked("c") + `) END AS id_pending,
           sel.id IS NULL AS busy
    FROM picked p
    JOIN ` + dl + ` dl ON dl.id = p.id AND dl.route = p.route
    LEFT JOIN sel ON sel.id = p.id AND sel.route = p.route
    LEFT JOIN done ON done.id = p.id AND done.route = p.route
) r
ORDER BY id, route`
}

// ReplayDeadLetters moves the dead letters of f back: a dead letter of the
// outbox into messages, a dead fan-out copy into its route's deliveries,
// under their ids and message ids, and reports each in (id, route) order.
// The inserts skip conflicts instead of failing (ON CONFLICT DO NOTHING,
// which also waits for and then respects a writer inserting the same dedup
// key right now), and only the dead letters whose message went in are
// deleted, in the same statement, so a skipped one stays where it was.
// Rows locked by another transaction are skipped (SKIP LOCKED): two
// concurrent replays never insert a message twice. With clearKeys a dead
// letter refused for its dedup key is inserted again without it.
func (s Schema) ReplayDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, clearKeys bool) ([]ReplayedRow, error) {
	return s.replay(ctx, q, s.replayDeadLettersSQL(), f, clearKeys)
}

func (s Schema) planReplaySQL() string {
	dl, msgs := s.Table("dead_letters"), s.Table("messages")
	return `
SELECT ` + replayColumns + ` FROM (
    SELECT r.id, r.route, r.message_id, r.dedup_key,
           CASE WHEN r.id_pending THEN 'skipped'
                WHEN r.key_holder IS NOT NULL OR r.run_holder IS NOT NULL THEN
                    CASE WHEN @clear_keys THEN 'replayed_without_dedup_key' ELSE 'skipped' END
                ELSE 'replayed' END AS outcome,
           r.key_holder, r.run_holder, r.id_pending, false AS busy
    FROM (
        SELECT d.id, d.route, d.message_id::text AS message_id, d.dedup_key,
               CASE WHEN d.route = '' THEN
                   (SELECT m.message_id::text FROM ` + msgs + ` m WHERE m.dedup_key = d.dedup_key AND m.id <> d.id) END AS key_holder,
               CASE WHEN d.route = '' THEN
                   (SELECT min(x.id) FROM ` + dl + ` x WHERE x.route = '' AND x.dedup_key = d.dedup_key AND x.id < d.id
                      AND (x.id, x.route) IN (SELECT id, route FROM ` + dl + deadLetterWhere + `)) END AS run_holder,
               CASE WHEN d.route = '' THEN EXISTS (SELECT 1 FROM ` + msgs + ` m WHERE m.id = d.id AND NOT ` + Parked("m") + `)
                    ELSE EXISTS (SELECT 1 FROM ` + s.Table("deliveries") + ` c WHERE c.route = d.route AND c.id = d.id AND NOT ` + Parked("c") + `) END AS id_pending
        FROM ` + dl + ` d` + deadLetterWhere + `
    ) r
) r
ORDER BY id, route`
}

// PlanReplay is ReplayDeadLetters as a dry run: the same decisions, made
// from what is pending now, without locking or changing anything.
func (s Schema) PlanReplay(ctx context.Context, q Querier, f DeadLetterFilter, clearKeys bool) ([]ReplayedRow, error) {
	return s.replay(ctx, q, s.planReplaySQL(), f, clearKeys)
}

func (s Schema) replay(ctx context.Context, q Querier, sql string, f DeadLetterFilter, clearKeys bool) ([]ReplayedRow, error) {
	args := f.args()
	args["clear_keys"] = clearKeys
	return collect(ctx, q, sql, args, scanReplayed)
}

// ArchiveFilter selects archived messages. A zero field does not filter.
type ArchiveFilter struct {
	// From and To bound the messages' creation time (To exclusive); From
	// also bounds their delivery time, which lets Postgres skip the
	// archive's older partitions.
	From, To time.Time
	// FromAgo and ToAgo are the same bounds before the database's now.
	FromAgo, ToAgo time.Duration
	Topic          string
	// Route selects what that route delivered.
	Route string
	// NewIDs gives the copies fresh message ids.
	NewIDs bool
}

func (f ArchiveFilter) args() pgx.NamedArgs {
	a := pgx.NamedArgs{"from": nil, "to": nil, "topic": nil, "from_ms": nil, "to_ms": nil, "route": nil, "new_ids": f.NewIDs}
	if !f.From.IsZero() {
		a["from"] = f.From
	}
	if !f.To.IsZero() {
		a["to"] = f.To
	}
	if f.Topic != "" {
		a["topic"] = f.Topic
	}
	if f.FromAgo > 0 {
		a["from_ms"] = f.FromAgo.Milliseconds()
	}
	if f.ToAgo > 0 {
		a["to_ms"] = f.ToAgo.Milliseconds()
	}
	if f.Route != "" {
		a["route"] = f.Route
	}
	return a
}

// archivePicked is ArchiveFilter's messages: a message fanned out to
// several routes is archived once per route, and comes out once, in the
// original order.
func (s Schema) archivePicked() string {
	return `SELECT DISTINCT ON (id) id, message_id, topic, key, payload, headers, created_at FROM ` + s.Table("archive") + `
WHERE (@from::timestamptz IS NULL OR (created_at >= @from AND delivered_at >= @from))
  AND (@to::timestamptz IS NULL OR created_at < @to) AND (@topic::text IS NULL OR topic = @topic)
  AND (@from_ms::bigint IS NULL OR (created_at >= now() - @from_ms * interval '1 millisecond'
                                    AND delivered_at >= now() - @from_ms * interval '1 millisecond'))
  AND (@to_ms::bigint IS NULL OR created_at < now() - @to_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
ORDER BY id`
}

func (s Schema) countArchivedSQL() string {
	// new_ids is not used by the count, but the filter's arguments are
	// always the same set.
	return `SELECT count(*) FROM (` + s.archivePicked() + `) p WHERE @new_ids::bool IS NOT NULL`
}

// CountArchived counts the archived messages of f.
func (s Schema) CountArchived(ctx context.Context, q Querier, f ArchiveFilter) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, s.countArchivedSQL(), f.args()).Scan(&n)
	return n, err
}

func (s Schema) replayArchiveSQL() string {
	return `
INSERT INTO ` + s.Table("messages") + ` (message_id, topic, key, payload, headers)
SELECT CASE WHEN @new_ids THEN gen_random_uuid() ELSE message_id END, topic, key, payload, headers
FROM (` + s.archivePicked() + `) p ORDER BY id`
}

// ReplayArchive writes the archived messages of f into the outbox again,
// in their original order, as new messages (new ids from the outbox's
// sequence, after everything written so far), and returns how many.
func (s Schema) ReplayArchive(ctx context.Context, q Querier, f ArchiveFilter) (int64, error) {
	tag, err := q.Exec(ctx, s.replayArchiveSQL(), f.args())
	return tag.RowsAffected(), err
}

func (s Schema) replayArchiveToRouteSQL() string {
	return `
INSERT INTO ` + s.Table("deliveries") + ` (route, id, message_id, topic, key, payload, headers, lane, created_at)
SELECT @route, p.new_id, CASE WHEN @new_ids THEN gen_random_uuid() ELSE p.message_id END, p.topic, p.key, p.payload, p.headers,
       ` + s.quoted + `.lane_of(p.key, p.new_id), now()
FROM (SELECT o.*, nextval(pg_get_serial_sequence(format('%I.messages', @schema::text), 'id')) AS new_id
      FROM (` + s.archivePicked() + `) o) p
ORDER BY p.new_id`
}

// ReplayArchiveToRoute is ReplayArchive into f.Route's fan-out copies
// instead of the outbox, so that no other route gets the messages again.
// The copies take new ids from the outbox's sequence.
func (s Schema) ReplayArchiveToRoute(ctx context.Context, q Querier, f ArchiveFilter) (int64, error) {
	args := f.args()
	args["schema"] = s.name
	tag, err := q.Exec(ctx, s.replayArchiveToRouteSQL(), args)
	return tag.RowsAffected(), err
}
