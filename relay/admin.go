package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// Admin runs the operator commands: status and dead-letter inspection,
// replay and purge.
type Admin struct {
	pool   *pgxpool.Pool
	s      string
	schema string
}

// NewAdmin returns an Admin for schema.
func NewAdmin(pool *pgxpool.Pool, schema string) (*Admin, error) {
	if schema == "" {
		schema = migrations.DefaultSchema
	}
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Admin{pool: pool, s: migrations.Ident(schema), schema: schema}, nil
}

// DeadLetter is one row of the dead-letter table.
type DeadLetter struct {
	ID        int64             `json:"id"`
	MessageID string            `json:"message_id"`
	Topic     string            `json:"topic"`
	Key       *string           `json:"key"`
	Payload   []byte            `json:"payload"`
	Headers   map[string]string `json:"headers"`
	CreatedAt time.Time         `json:"created_at"`
	Attempts  int               `json:"attempts"`
	Reason    string            `json:"reason"`
	// Route is the fan-out destination whose copy died ("" for a message
	// dead-lettered from the outbox itself).
	Route         string     `json:"route"`
	FirstError    *string    `json:"first_error"`
	LastError     *string    `json:"last_error"`
	FirstFailedAt *time.Time `json:"first_failed_at"`
	DeadAt        time.Time  `json:"dead_at"`
}

// Selection picks dead letters. Replay and Purge refuse an empty selection
// (set All to mean everything).
type Selection struct {
	IDs   []int64
	Topic string
	// Route selects the dead letters of one fan-out destination.
	Route string
	// DeadBefore selects dead letters that died before this time.
	DeadBefore time.Time
	// OlderThan selects dead letters that died longer ago than this, on
	// the database clock (an operator's clock may be off).
	OlderThan time.Duration
	All       bool
	// Limit caps List (default 100); Replay and Purge ignore it.
	Limit int
}

// ErrEmptySelection is returned by Replay and Purge for a selection that
// names nothing.
var ErrEmptySelection = errors.New("outbox: select dead letters by id, topic or age, or pass all")

// Empty reports whether s selects nothing.
func (s Selection) Empty() bool {
	return len(s.IDs) == 0 && s.Topic == "" && s.Route == "" && s.DeadBefore.IsZero() && s.OlderThan <= 0 && !s.All
}

func (s Selection) args() []any {
	var ids any
	if len(s.IDs) > 0 {
		ids = s.IDs
	}
	var topic any
	if s.Topic != "" {
		topic = s.Topic
	}
	var before, olderMS any
	if !s.DeadBefore.IsZero() {
		before = s.DeadBefore
	}
	if s.OlderThan > 0 {
		olderMS = s.OlderThan.Milliseconds()
	}
	var route any
	if s.Route != "" {
		route = s.Route
	}
	return []any{ids, topic, before, olderMS, route}
}

const selWhere = ` WHERE ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR topic = $2)
  AND ($3::timestamptz IS NULL OR dead_at < $3)
  AND ($4::bigint IS NULL OR dead_at < now() - $4 * interval '1 millisecond')
  AND ($5::text IS NULL OR route = $5)`

const dlColumns = `id, message_id::text, topic, key, payload, headers, created_at, attempts, reason, route, first_error, last_error, first_failed_at, dead_at`

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	var created, firstFailed, dead pgtype.Timestamptz
	err := row.Scan(&d.ID, &d.MessageID, &d.Topic, &d.Key, &d.Payload, &d.Headers, &created, &d.Attempts,
		&d.Reason, &d.Route, &d.FirstError, &d.LastError, &firstFailed, &dead)
	d.CreatedAt, d.FirstFailedAt, d.DeadAt = finiteTime(created, time.Time{}), finiteTimePtr(firstFailed), finiteTime(dead, time.Time{})
	return d, err
}

// boundedTime is a timestamp column as the relay treats it in ages: on
// the database's clock, never later than now, and now for ±infinity.
func boundedTime(col string) string {
	return `(CASE WHEN isfinite(` + col + `) THEN least(` + col + `, now()) ELSE now() END)`
}

// List returns dead letters in id order.
func (a *Admin) List(ctx context.Context, sel Selection) ([]DeadLetter, error) {
	if sel.Limit <= 0 {
		sel.Limit = 100
	}
	rows, err := a.pool.Query(ctx, `SELECT `+dlColumns+` FROM `+a.s+`.dead_letters`+selWhere+` ORDER BY id, route LIMIT $6`,
		append(sel.args(), sel.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return out, nil
}

// ErrNotFound is returned by Show for an unknown id.
var ErrNotFound = errors.New("outbox: no such dead letter")

// Show returns the dead letters of one message: one, or one per fan-out
// destination whose copy died.
func (a *Admin) Show(ctx context.Context, id int64) ([]DeadLetter, error) {
	rows, err := a.pool.Query(ctx, `SELECT `+dlColumns+` FROM `+a.s+`.dead_letters WHERE id = $1 ORDER BY route`, id)
	if err != nil {
		return nil, fmt.Errorf("outbox: show dead letter: %w", err)
	}
	ds, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("outbox: show dead letter: %w", err)
	}
	if len(ds) == 0 {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	return ds, nil
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// DryRun only reports what Replay would do, without changing or
	// locking anything.
	DryRun bool
	// ClearConflictingDedupKeys replays a dead letter whose dedup key is
	// held by a pending message (or by an earlier dead letter replayed in
	// the same run) without its dedup key, instead of skipping it. Default
	// false: such a dead letter is skipped and stays in the table.
	ClearConflictingDedupKeys bool
}

// ReplayOutcome says what Replay did with one dead letter.
type ReplayOutcome string

// Replay outcomes.
const (
	// Replayed: back in the outbox (or, for a dead fan-out copy, in its
	// destination's deliveries) with its dedup key.
	Replayed ReplayOutcome = "replayed"
	// ReplayedWithoutDedupKey: replayed with its dedup key cleared,
	// because another message held the key (ClearConflictingDedupKeys).
	ReplayedWithoutDedupKey ReplayOutcome = "replayed_without_dedup_key"
	// ReplaySkipped: left in the dead-letter table; Reason says why.
	ReplaySkipped ReplayOutcome = "skipped"
)

// ReplayCause is why Replay skipped a dead letter or cleared its dedup
// key.
type ReplayCause string

// Replay causes.
const (
	// CauseDedupKeyPending: a pending message holds the dedup key (HeldBy).
	CauseDedupKeyPending ReplayCause = "dedup_key_pending"
	// CauseDedupKeyInRun: an older dead letter replayed in the same run
	// took the dedup key.
	CauseDedupKeyInRun ReplayCause = "dedup_key_in_run"
	// CauseIDPending: the message (or, for a fan-out copy, its copy for
	// that route) is pending already.
	CauseIDPending ReplayCause = "id_pending"
	// CauseBusy: another transaction held the dead letter (a concurrent
	// replay or purge).
	CauseBusy ReplayCause = "busy"
	// CauseConflict: another unique index of the outbox refused it.
	CauseConflict ReplayCause = "conflict"
)

// ReplayedDeadLetter is what Replay did (or, in a dry run, would do) with
// one selected dead letter.
type ReplayedDeadLetter struct {
	ID        int64   `json:"id"`
	Route     string  `json:"route"`
	MessageID string  `json:"message_id"`
	DedupKey  *string `json:"dedup_key"`
	// Outcome is replayed, replayed_without_dedup_key or skipped.
	Outcome ReplayOutcome `json:"outcome"`
	// Cause says, for a skip or a cleared dedup key, what stood in the
	// way (one of the ReplayCause constants); Reason says it in words.
	// Both are empty for a dead letter replayed as it was.
	Cause  ReplayCause `json:"cause,omitempty"`
	Reason string      `json:"reason,omitempty"`
	// HeldBy is the message id of the pending message that holds the
	// dead letter's dedup key, when that is why it was skipped or cleared
	// (and the message was visible when the replay started).
	HeldBy string `json:"held_by,omitempty"`
}

// ReplayResult reports Replay's decision for every selected dead letter,
// in id order.
type ReplayResult struct {
	DryRun      bool                 `json:"dry_run"`
	DeadLetters []ReplayedDeadLetter `json:"dead_letters"`
}

// IDs returns the ids of the dead letters with one of the outcomes (all
// of them when none is given).
func (r ReplayResult) IDs(outcomes ...ReplayOutcome) []int64 {
	var ids []int64
	for _, d := range r.DeadLetters {
		if len(outcomes) == 0 || slices.Contains(outcomes, d.Outcome) {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// Count returns how many dead letters had outcome o.
func (r ReplayResult) Count(o ReplayOutcome) int {
	n := 0
	for _, d := range r.DeadLetters {
		if d.Outcome == o {
			n++
		}
	}
	return n
}

// Replay moves the selected dead letters back into the outbox under their
// original id and message id, with a fresh attempt count; a dead fan-out
// copy goes back to its own destination only (the routes that delivered
// the message do not get it again). Rows another operator is replaying at
// the same moment are skipped, so two concurrent replays never publish a
// message twice.
//
// A dead letter whose dedup key a pending message holds (the application
// wrote the operation again while it was dead) is skipped and stays in the
// table: replaying it too would publish the operation twice under two
// message ids, which consumers deduplicating by message id cannot catch.
// The operator decides: purge it, replay it once the pending message is
// delivered, or replay it without its dedup key
// (ReplayOptions.ClearConflictingDedupKeys). The same holds for several
// selected dead letters sharing a dedup key: the oldest gets the key. One
// such conflict never stops the others from being replayed.
func (a *Admin) Replay(ctx context.Context, sel Selection, opts ReplayOptions) (ReplayResult, error) {
	if sel.Empty() {
		return ReplayResult{}, ErrEmptySelection
	}
	args := append(sel.args(), opts.ClearConflictingDedupKeys)
	q := a.replayQuery()
	if opts.DryRun {
		q = a.replayPlanQuery()
	}
	rows, err := a.pool.Query(ctx, q, args...)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("outbox: replay: %w", err)
	}
	res := ReplayResult{DryRun: opts.DryRun}
	res.DeadLetters, err = pgx.CollectRows(rows, scanReplayed)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("outbox: replay: %w", err)
	}
	return res, nil
}

// Both replay statements return, per selected dead letter: id, route,
// message id, dedup key, outcome, and what stood in the way: a pending
// message holding the dedup key (its message id), an earlier dead letter
// of the same run that took the key (its id), the message's id already
// pending (for a copy: in that route), or a lock held by another
// transaction.
const replayColumns = `id, route, message_id, dedup_key, outcome, key_holder, run_holder, id_pending, busy`

func scanReplayed(row pgx.CollectableRow) (ReplayedDeadLetter, error) {
	var d ReplayedDeadLetter
	var outcome string
	var holder *string
	var runHolder *int64
	var idPending, busy bool
	if err := row.Scan(&d.ID, &d.Route, &d.MessageID, &d.DedupKey, &outcome, &holder, &runHolder, &idPending, &busy); err != nil {
		return d, err
	}
	d.Outcome = ReplayOutcome(outcome)
	if d.Outcome == Replayed {
		return d, nil
	}
	key := ""
	if d.DedupKey != nil {
		key = *d.DedupKey
	}
	switch {
	case busy:
		d.Cause = CauseBusy
		d.Reason = "locked by another transaction (a concurrent replay or purge): replay it again if it is still listed"
	case idPending && d.Route != "":
		d.Cause = CauseIDPending
		d.Reason = fmt.Sprintf("a copy of message %d is already pending for route %q", d.ID, d.Route)
	case idPending:
		d.Cause = CauseIDPending
		d.Reason = fmt.Sprintf("message %d is already pending in the outbox", d.ID)
	case holder != nil:
		d.Cause, d.HeldBy = CauseDedupKeyPending, *holder
		d.Reason = fmt.Sprintf("dedup key %q is held by pending message %s", key, *holder)
	case runHolder != nil:
		d.Cause = CauseDedupKeyInRun
		d.Reason = fmt.Sprintf("dedup key %q went to dead letter %d, replayed in the same run", key, *runHolder)
	case d.DedupKey != nil:
		// The holder committed after the replay's snapshot was taken.
		d.Cause = CauseDedupKeyPending
		d.Reason = fmt.Sprintf("dedup key %q is held by a message written during the replay", key)
	default:
		// Another unique index of the outbox refused it.
		d.Cause = CauseConflict
		d.Reason = "a pending message written during the replay conflicts with it"
	}
	if d.Outcome == ReplaySkipped && (d.Cause == CauseDedupKeyPending || d.Cause == CauseDedupKeyInRun) {
		d.Reason += ": purge it if that is the same operation, or replay it once the key is free or without its dedup key"
	}
	return d, nil
}

// replayQuery moves the dead letters. The inserts skip conflicts instead
// of failing (ON CONFLICT DO NOTHING, which also waits for and then
// respects a writer inserting the same dedup key right now), and only the
// dead letters whose message actually went in are deleted, in the same
// statement: a skipped one stays where it was.
func (a *Admin) replayQuery() string {
	s := a.s
	return `
WITH picked AS MATERIALIZED (
    SELECT id, route FROM ` + s + `.dead_letters` + selWhere + `
), sel AS MATERIALIZED (
    SELECT id, route FROM ` + s + `.dead_letters` + selWhere + ` ORDER BY id, route FOR UPDATE SKIP LOCKED
), d AS MATERIALIZED (
    SELECT dl.* FROM ` + s + `.dead_letters dl JOIN sel USING (id, route)
), outbox AS (
    INSERT INTO ` + s + `.messages (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, dedup_key, priority FROM d
    WHERE route = '' ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), cleared AS (
    INSERT INTO ` + s + `.messages (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, NULL, priority FROM d
    WHERE $6 AND route = '' AND dedup_key IS NOT NULL AND id NOT IN (SELECT id FROM outbox) ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), copies AS (
    INSERT INTO ` + s + `.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
    SELECT route, id, message_id, topic, key, payload, headers, ` + s + `.lane_of(key, id), created_at, dedup_key, priority FROM d
    WHERE route <> '' ORDER BY id
    ON CONFLICT (route, id) DO NOTHING
    RETURNING route, id
), done AS MATERIALIZED (
    SELECT id, '' AS route, 'replayed' AS outcome FROM outbox
    UNION ALL SELECT id, '', 'replayed_without_dedup_key' FROM cleared
    UNION ALL SELECT id, route, 'replayed' FROM copies
), gone AS (
    DELETE FROM ` + s + `.dead_letters dl USING done WHERE dl.id = done.id AND dl.route = done.route
)
SELECT ` + replayColumns + ` FROM (
    SELECT p.id, p.route, dl.message_id::text AS message_id, dl.dedup_key,
           coalesce(done.outcome, 'skipped') AS outcome,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT m.message_id::text FROM ` + s + `.messages m WHERE m.dedup_key = dl.dedup_key) END AS key_holder,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT min(x.id) FROM d x WHERE x.route = '' AND x.dedup_key = dl.dedup_key AND x.id < p.id
                  AND x.id IN (SELECT id FROM outbox)) END AS run_holder,
           done.id IS NULL AND CASE WHEN p.route = '' THEN EXISTS (SELECT 1 FROM ` + s + `.messages m WHERE m.id = p.id)
               ELSE EXISTS (SELECT 1 FROM ` + s + `.deliveries c WHERE c.route = p.route AND c.id = p.id) END AS id_pending,
           sel.id IS NULL AS busy
    FROM picked p
    JOIN ` + s + `.dead_letters dl ON dl.id = p.id AND dl.route = p.route
    LEFT JOIN sel ON sel.id = p.id AND sel.route = p.route
    LEFT JOIN done ON done.id = p.id AND done.route = p.route
) r
ORDER BY id, route`
}

// replayPlanQuery is the dry run of replayQuery: the same decisions, made
// from what is pending now, without locking or changing anything.
func (a *Admin) replayPlanQuery() string {
	s := a.s
	return `
SELECT ` + replayColumns + ` FROM (
    SELECT r.id, r.route, r.message_id, r.dedup_key,
           CASE WHEN r.id_pending THEN 'skipped'
                WHEN r.key_holder IS NOT NULL OR r.run_holder IS NOT NULL THEN
                    CASE WHEN $6 THEN 'replayed_without_dedup_key' ELSE 'skipped' END
                ELSE 'replayed' END AS outcome,
           r.key_holder, r.run_holder, r.id_pending, false AS busy
    FROM (
        SELECT d.id, d.route, d.message_id::text AS message_id, d.dedup_key,
               CASE WHEN d.route = '' THEN
                   (SELECT m.message_id::text FROM ` + s + `.messages m WHERE m.dedup_key = d.dedup_key) END AS key_holder,
               CASE WHEN d.route = '' THEN
                   (SELECT min(x.id) FROM ` + s + `.dead_letters x WHERE x.route = '' AND x.dedup_key = d.dedup_key AND x.id < d.id
                      AND (x.id, x.route) IN (SELECT id, route FROM ` + s + `.dead_letters` + selWhere + `)) END AS run_holder,
               CASE WHEN d.route = '' THEN EXISTS (SELECT 1 FROM ` + s + `.messages m WHERE m.id = d.id)
                    ELSE EXISTS (SELECT 1 FROM ` + s + `.deliveries c WHERE c.route = d.route AND c.id = d.id) END AS id_pending
        FROM ` + s + `.dead_letters d` + selWhere + `
    ) r
) r
ORDER BY id, route`
}

// Purge deletes the selected dead letters for good and returns how many.
func (a *Admin) Purge(ctx context.Context, sel Selection, dryRun bool) (int64, error) {
	if sel.Empty() {
		return 0, ErrEmptySelection
	}
	if dryRun {
		ids, err := a.ids(ctx, sel)
		return int64(len(ids)), err
	}
	tag, err := a.pool.Exec(ctx, `DELETE FROM `+a.s+`.dead_letters`+selWhere, sel.args()...)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (a *Admin) ids(ctx context.Context, sel Selection) ([]int64, error) {
	rows, err := a.pool.Query(ctx, `SELECT id FROM `+a.s+`.dead_letters`+selWhere+` ORDER BY id, route`, sel.args()...)
	if err != nil {
		return nil, fmt.Errorf("outbox: select dead letters: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// Status is a snapshot of the outbox for operators.
type Status struct {
	Now          time.Time     `json:"now"`
	Pending      int64         `json:"pending"`
	Retrying     int64         `json:"retrying"`
	OldestAge    time.Duration `json:"oldest_pending_age_ns"`
	DeadLetters  int64         `json:"dead_letters"`
	Topics       []TopicStatus `json:"topics"`
	DeadByReason []DeadCount   `json:"dead_letters_by_reason"`
	// FanOut is the backlog of fan-out copies per destination route.
	FanOut []RouteStatus `json:"fan_out"`
	Relays []RelayStatus `json:"relays"`
	Lanes  []LaneStatus  `json:"lanes"`
	// FreeLanes is how many lanes, over all routes, no live relay works
	// (LaneStatus.Unworked summed, missing lane rows included).
	FreeLanes int `json:"free_lanes"`
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

// RouteStatus is the backlog of fan-out copies of one destination route.
type RouteStatus struct {
	Route       string        `json:"route"`
	Pending     int64         `json:"pending"`
	Retrying    int64         `json:"retrying"`
	OldestAge   time.Duration `json:"oldest_pending_age_ns"`
	DeadLetters int64         `json:"dead_letters"`
}

// TopicStatus is the backlog of one topic (fan-out copies count once per
// destination).
type TopicStatus struct {
	Topic       string        `json:"topic"`
	Pending     int64         `json:"pending"`
	Retrying    int64         `json:"retrying"`
	OldestAge   time.Duration `json:"oldest_pending_age_ns"`
	DeadLetters int64         `json:"dead_letters"`
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
}

// Status reads the backlog per topic, dead letters and live relays. It
// scans the outbox, so it is for operators, not for scraping every second.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	var st Status
	err := pgx.BeginTxFunc(ctx, a.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&st.Now); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
SELECT coalesce(p.topic, d.topic), coalesce(p.n, 0), coalesce(p.retrying, 0),
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, coalesce(d.n, 0)
FROM (SELECT topic, count(*) n, count(*) FILTER (WHERE attempts > 0) retrying, min(`+boundedTime("created_at")+`) oldest
      FROM (SELECT topic, attempts, created_at FROM `+a.s+`.messages
            UNION ALL SELECT topic, attempts, created_at FROM `+a.s+`.deliveries) u
      GROUP BY topic) p
FULL JOIN (SELECT topic, count(*) n FROM `+a.s+`.dead_letters GROUP BY topic) d ON d.topic = p.topic
ORDER BY 1`)
		if err != nil {
			return err
		}
		st.Topics, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicStatus, error) {
			var t TopicStatus
			var age float64
			err := r.Scan(&t.Topic, &t.Pending, &t.Retrying, &age, &t.DeadLetters)
			t.OldestAge = time.Duration(age * float64(time.Second))
			return t, err
		})
		if err != nil {
			return err
		}
		for _, t := range st.Topics {
			st.Pending += t.Pending
			st.Retrying += t.Retrying
			st.DeadLetters += t.DeadLetters
			st.OldestAge = max(st.OldestAge, t.OldestAge)
		}
		rows, err = tx.Query(ctx, `SELECT topic, reason, count(*) FROM `+a.s+`.dead_letters GROUP BY 1, 2 ORDER BY 1, 2`)
		if err != nil {
			return err
		}
		st.DeadByReason, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadCount, error) {
			var d DeadCount
			return d, r.Scan(&d.Topic, &d.Reason, &d.Count)
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `
SELECT coalesce(p.route, d.route), coalesce(p.n, 0), coalesce(p.retrying, 0),
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, coalesce(d.n, 0)
FROM (SELECT route, count(*) n, count(*) FILTER (WHERE attempts > 0) retrying, min(`+boundedTime("created_at")+`) oldest
      FROM `+a.s+`.deliveries GROUP BY route) p
FULL JOIN (SELECT route, count(*) n FROM `+a.s+`.dead_letters WHERE route <> '' GROUP BY route) d ON d.route = p.route
ORDER BY 1`)
		if err != nil {
			return err
		}
		st.FanOut, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (RouteStatus, error) {
			var x RouteStatus
			var age float64
			err := r.Scan(&x.Route, &x.Pending, &x.Retrying, &age, &x.DeadLetters)
			x.OldestAge = time.Duration(age * float64(time.Second))
			return x, err
		})
		if err != nil {
			return err
		}
		// A heartbeat in the future counts as now (relays reap such a
		// row a lease TTL later); -infinity shows as the zero time.
		rows, err = tx.Query(ctx, `
SELECT r.id, r.hostname, r.pid, r.version, least(r.started_at, now()), least(r.heartbeat_at, now()), r.route,
       (SELECT count(*) FROM `+a.s+`.lanes l WHERE l.owner = r.id AND l.lease_until > now())::int, r.in_flight
FROM `+a.s+`.relays r ORDER BY r.route, r.id`)
		if err != nil {
			return err
		}
		st.Relays, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelayStatus, error) {
			var x RelayStatus
			var started, beat pgtype.Timestamptz
			err := r.Scan(&x.ID, &x.Hostname, &x.PID, &x.Version, &started, &beat, &x.Route, &x.Lanes, &x.InFlight)
			x.StartedAt, x.HeartbeatAt = finiteTime(started, time.Time{}), finiteTime(beat, time.Time{})
			return x, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `
WITH routes AS (SELECT route FROM `+a.s+`.lanes UNION SELECT route FROM `+a.s+`.relays)
SELECT rt.route,
       (SELECT count(*) FROM `+a.s+`.relays r WHERE r.route = rt.route)::int,
       (SELECT count(*) FROM `+a.s+`.lanes l WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255)::int,
       (SELECT count(*) FROM `+a.s+`.lanes l
        WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255 AND l.owner IS NOT NULL AND l.lease_until > now()
          AND EXISTS (SELECT 1 FROM `+a.s+`.relays r WHERE r.id = l.owner))::int
FROM routes rt ORDER BY 1`)
		if err != nil {
			return err
		}
		st.Lanes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LaneStatus, error) {
			var x LaneStatus
			var present int
			err := r.Scan(&x.Route, &x.Relays, &present, &x.Worked)
			x.Missing, x.Unworked = numLanes-present, numLanes-x.Worked
			return x, err
		})
		if err != nil {
			return err
		}
		for _, l := range st.Lanes {
			st.FreeLanes += l.Unworked
		}
		return nil
	})
	if err != nil {
		return Status{}, fmt.Errorf("outbox: status: %w", err)
	}
	return st, nil
}

// ArchiveSelection picks archived messages to publish again.
type ArchiveSelection struct {
	// From and To bound the messages' creation time (To exclusive; zero
	// means no bound).
	From, To time.Time
	// FromAgo and ToAgo give the same bounds relative to the database's
	// clock (zero: unused).
	FromAgo, ToAgo time.Duration
	// Topic limits the replay to one topic (empty: all).
	Topic string
	// NewIDs gives the replayed messages fresh message ids, for consumers
	// that would drop them as duplicates. By default they keep their id.
	NewIDs bool
	// Route limits the replay to the messages that route delivered
	// (empty: all, each message once however many routes delivered it).
	Route string
	// ToRouteOnly sends the replayed messages to Route alone, as fan-out
	// copies, instead of back into the outbox, where every route taking
	// their topic would get them. Use it for a route fed by the fan-out
	// router; a route reading the outbox directly is the only one taking
	// its topics anyway.
	ToRouteOnly bool
}

// ErrReplayRoute is returned by ReplayArchive for ToRouteOnly without a
// Route.
var ErrReplayRoute = errors.New("outbox: replay to one route needs the route")

// ReplayArchive copies archived messages back into the outbox, in their
// original order, and returns how many. With dryRun it only counts.
func (a *Admin) ReplayArchive(ctx context.Context, sel ArchiveSelection, dryRun bool) (int64, error) {
	where := ` WHERE ($1::timestamptz IS NULL OR (created_at >= $1 AND delivered_at >= $1))
  AND ($2::timestamptz IS NULL OR created_at < $2) AND ($3::text IS NULL OR topic = $3)
  AND ($5::bigint IS NULL OR (created_at >= now() - $5 * interval '1 millisecond'
                              AND delivered_at >= now() - $5 * interval '1 millisecond'))
  AND ($6::bigint IS NULL OR created_at < now() - $6 * interval '1 millisecond')
  AND ($7::text IS NULL OR route = $7)`
	if sel.ToRouteOnly && sel.Route == "" {
		return 0, ErrReplayRoute
	}
	var from, to, topic, fromAgo, toAgo, route any
	if sel.FromAgo > 0 {
		fromAgo = sel.FromAgo.Milliseconds()
	}
	if sel.ToAgo > 0 {
		toAgo = sel.ToAgo.Milliseconds()
	}
	if !sel.From.IsZero() {
		from = sel.From
	}
	if !sel.To.IsZero() {
		to = sel.To
	}
	if sel.Topic != "" {
		topic = sel.Topic
	}
	if sel.Route != "" {
		route = sel.Route
	}
	args := []any{from, to, topic, sel.NewIDs, fromAgo, toAgo, route}
	// A message fanned out to several routes is archived once per route:
	// one of each id, in the original order.
	picked := `SELECT DISTINCT ON (id) id, message_id, topic, key, payload, headers, created_at FROM ` + a.s + `.archive` + where + ` ORDER BY id`
	if dryRun {
		var n int64
		err := a.pool.QueryRow(ctx, `SELECT count(*) FROM (`+picked+`) p WHERE $4::bool IS NOT NULL`, args...).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("outbox: replay archive: %w", err)
		}
		return n, nil
	}
	// Replayed messages are new messages (new ids from the outbox's
	// sequence, after everything written so far).
	insert := `
INSERT INTO ` + a.s + `.messages (message_id, topic, key, payload, headers)
SELECT CASE WHEN $4 THEN gen_random_uuid() ELSE message_id END, topic, key, payload, headers
FROM (` + picked + `) p ORDER BY id`
	if sel.ToRouteOnly {
		insert = `
INSERT INTO ` + a.s + `.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at)
SELECT $7, p.new_id, CASE WHEN $4 THEN gen_random_uuid() ELSE p.message_id END, p.topic, p.key, p.payload, p.headers,
       ` + a.s + `.lane_of(p.key, p.new_id), now()
FROM (SELECT o.*, nextval(pg_get_serial_sequence(format('%I.messages', $8::text), 'id')) AS new_id
      FROM (` + picked + `) o) p
ORDER BY p.new_id`
		args = append(args, a.schema)
	}
	tag, err := a.pool.Exec(ctx, insert, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: replay archive: %w", err)
	}
	return tag.RowsAffected(), nil
}
