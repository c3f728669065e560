package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Settlement: what happens to a claimed batch's rows in the claim's
// transaction once the sink has answered. Which rows go where is the
// relay's decision (package relay, settle.go); these are its statements.
// They are queued on the batch that commits, so a whole settlement costs
// one round trip.

// Retries are rows to try again later, as parallel slices: row Seqs[i]
// failed with Errors[i] and waits DelayMillis[i].
type Retries struct {
	Seqs        []int64
	DelayMillis []int64
	Errors      []string
}

// DeadLetters are rows the relay gives up on, as parallel slices: row
// Seqs[i] for Reasons[i] after Errors[i].
type DeadLetters struct {
	Seqs    []int64
	Reasons []string
	Errors  []string
}

// QueueDelete queues the removal of the delivered rows at ctids. By ctid:
// the rows are locked by this transaction since the claim, so their
// physical address cannot change, and a TID scan saves a primary-key
// descent per row.
func (e *Engine) QueueDelete(b *pgx.Batch, ctids []pgtype.TID) {
	b.Queue(e.deleteDelivered.sql, e.args(e.deleteDelivered, pgx.NamedArgs{"ctids": ctids})...)
}

// QueueArchive queues the move of the delivered rows at ctids to the
// day's archive partition (with the archive on), recording the relay's
// route; by ctid, as QueueDelete.
func (e *Engine) QueueArchive(b *pgx.Batch, ctids []pgtype.TID) {
	b.Queue(e.archiveDelivered.sql, e.args(e.archiveDelivered, pgx.NamedArgs{"ctids": ctids})...)
}

// QueueRetry queues the retries r: each row counts one more attempt,
// becomes deliverable after its delay, and keeps its first and last error.
func (e *Engine) QueueRetry(b *pgx.Batch, r Retries) {
	b.Queue(e.scheduleRetry.sql, e.args(e.scheduleRetry, pgx.NamedArgs{"ids": r.Seqs, "delay_ms": r.DelayMillis, "errors": r.Errors})...)
}

// QueueDefer queues the deferral of rows d: each becomes deliverable
// after its delay and records its error as the last one, without
// counting an attempt (its destination was down: it was not sent).
func (e *Engine) QueueDefer(b *pgx.Batch, d Retries) {
	b.Queue(e.deferRows.sql, e.args(e.deferRows, pgx.NamedArgs{"ids": d.Seqs, "delay_ms": d.DelayMillis, "errors": d.Errors})...)
}

// QueueDeadLetter queues the move of rows d to the dead letters. A dead
// letter records the route it must be replayed to: none for a message of
// the outbox (a replay routes it again), the relay's own for a fan-out
// copy (a replay goes to that route only).
func (e *Engine) QueueDeadLetter(b *pgx.Batch, d DeadLetters) {
	b.Queue(e.deadLetter.sql, e.args(e.deadLetter, pgx.NamedArgs{"ids": d.Seqs, "reasons": d.Reasons, "errors": d.Errors})...)
}

// Relock locks the rows ids of this source again in a new transaction,
// skipping those another transaction holds, and returns the ctid of each
// row it locked. A batch whose settlement the database refused is settled
// again row by row this way (their ctids are unchanged unless another
// relay took them).
func (e *Engine) Relock(ctx context.Context, q Querier, ids []int64) (map[int64]pgtype.TID, error) {
	// Planned for these ids each time (pgx's exec mode): the plan kept
	// for a prepared m.id = ANY(@ids), made while the outbox was empty,
	// reads the whole (lane, id) index once a backlog came (see
	// archiveDelivered). A rare path: a settlement the database refused.
	args := append([]any{pgx.QueryExecModeExec}, e.args(e.relock, pgx.NamedArgs{"ids": ids})...)
	rows, err := q.Query(ctx, e.relock.sql, args...)
	if err != nil {
		return nil, err
	}
	tids := map[int64]pgtype.TID{}
	var id int64
	var tid pgtype.TID
	_, err = pgx.ForEachRow(rows, []any{&id, &tid}, func() error { tids[id] = tid; return nil })
	return tids, err
}

// andRoute is " AND a.route = @route" on copies: every statement on them
// matches the relay's route too.
func (e *Engine) andRoute(a string) string {
	if e.source == Copies {
		return " AND " + a + ".route = @route"
	}
	return ""
}

func (e *Engine) renderSettle(s Schema) {
	src := e.table(s)
	e.deleteDelivered = newStmt(`DELETE FROM ` + src + ` WHERE ctid = ANY(@ctids::tid[])`)

	e.relock = newStmt(`SELECT m.id, m.ctid FROM ` + src + ` m WHERE m.id = ANY(@ids)` + e.andRoute("m") + ` FOR UPDATE SKIP LOCKED`)

	// By ctid, as the delete (see QueueDelete; the rows are this
	// transaction's, of this route, since the claim). Not by id: planned
	// once while the outbox was empty, m.id = ANY(@ids) read the whole
	// (lane, id) index for every batch once a backlog came, and a route's
	// condition beside the ctids all of the route's rows
	// (TestSettlementsPlannedOnAnEmptyOutbox).
	e.archiveDelivered = newStmt(`
WITH d AS (
    DELETE FROM ` + src + ` m WHERE m.ctid = ANY(@ctids::tid[])
    RETURNING id, message_id, topic, key, payload, headers, created_at
)
INSERT INTO ` + s.Table("archive") + ` (id, message_id, topic, key, payload, headers, created_at, delivered_at, route)
SELECT id, message_id, topic, key, payload, headers, created_at, now(), @route::text FROM d`)

	// clock_timestamp: the delay counts from the settlement, not from the
	// claim (a slow sink would otherwise eat into it). Read once (c), so
	// that a first failure's available_at is exactly its delay after
	// first_failed_at: two calls a few microseconds apart made the stored
	// delay 799.998ms for a backoff of 800ms.
	e.scheduleRetry = newStmt(`
UPDATE ` + src + ` m SET
    attempts = m.attempts + 1,
    available_at = c.t + f.delay_ms * interval '1 millisecond',
    last_error = f.err,
    first_error = coalesce(m.first_error, f.err),
    first_failed_at = coalesce(m.first_failed_at, c.t)
FROM unnest(@ids::bigint[], @delay_ms::bigint[], @errors::text[]) AS f(id, delay_ms, err),
     (SELECT clock_timestamp() AS t) c
WHERE m.id = f.id` + e.andRoute("m"))

	e.deferRows = newStmt(`
UPDATE ` + src + ` m SET
    available_at = clock_timestamp() + f.delay_ms * interval '1 millisecond',
    last_error = f.err
FROM unnest(@ids::bigint[], @delay_ms::bigint[], @errors::text[]) AS f(id, delay_ms, err)
WHERE m.id = f.id` + e.andRoute("m"))

	deadRoute := "''"
	if e.source == Copies {
		deadRoute = "@route::text"
	}
	// The rows that die: deleted, or with hold, a keyed row parked in
	// place (a held keyless message holds nothing: it goes).
	dead := `
), d AS (
    DELETE FROM ` + src + ` m USING f WHERE m.id = f.id` + e.andRoute("m") + `
    RETURNING m.*, f.reason, f.err
)`
	if e.hold {
		heldRoute := ""
		if e.source != Copies {
			heldRoute = ", held_route = @route::text"
		}
		dead = `
), p AS (
    UPDATE ` + src + ` m SET available_at = ` + ParkedUntil + `, held_since = now()` + heldRoute + `
    FROM f WHERE m.id = f.id` + e.andRoute("m") + ` AND m.key IS NOT NULL
    RETURNING m.*, f.reason, f.err
), g AS (
    DELETE FROM ` + src + ` m USING f WHERE m.id = f.id` + e.andRoute("m") + ` AND m.key IS NULL
    RETURNING m.*, f.reason, f.err
), d AS (
    SELECT * FROM p UNION ALL SELECT * FROM g
)`
	}
	e.deadLetter = newStmt(`
WITH f AS (
    SELECT * FROM unnest(@ids::bigint[], @reasons::text[], @errors::text[]) AS f(id, reason, err)` + dead + `
INSERT INTO ` + s.Table("dead_letters") + `
    (id, message_id, topic, key, payload, headers, created_at, attempts, reason,
     first_error, last_error, first_failed_at, dedup_key, priority, route)
SELECT id, message_id, topic, key, payload, headers, created_at, attempts + 1, reason,
       coalesce(first_error, err), err, coalesce(first_failed_at, now()), dedup_key, priority, ` + deadRoute + `
FROM d
ON CONFLICT (id, route) DO UPDATE SET
    message_id = EXCLUDED.message_id, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
    attempts = EXCLUDED.attempts, reason = EXCLUDED.reason, first_error = EXCLUDED.first_error,
    last_error = EXCLUDED.last_error, first_failed_at = EXCLUDED.first_failed_at,
    dedup_key = EXCLUDED.dedup_key, priority = EXCLUDED.priority, dead_at = now()`)
}
