package store

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The claim: how a worker takes a batch of messages from its lanes. This
// file is the one place that decides which rows a claim takes and in what
// order.
//
// A claim takes up to @limit deliverable messages, at most @lane_limit of
// them from one lane, and at most @max_bytes of payload (but always the
// first message), from the lanes of @lanes that relay @relay
// leases in route @route and that belong to this worker (lane % @workers =
// @worker), starting at lane @rotation so that every lane gets its turn.
// @topics and @exclude are the route's topic patterns (LIKE form) and those
// of earlier routes; NULL means no filter. @handover are lanes being handed
// over to another relay: not claimed any more. @lanes are the lanes
// visited: those the relay believes it leases, or those a wake-up named
// since the worker's last claim (ClaimParams.Only).
//
// The lanes table is not scanned for the relay's lanes: the list comes
// from the relay, and only a lane whose probe finds a deliverable message
// has its lane row read (the lateral k, which checks the lease there,
// and locks it). A list that is out of date costs a probe, never a
// wrong claim. A scan of the lanes table (256 rows a route, rewritten by
// every heartbeat) cost 13 buffers as a bitmap scan and 160 as an index
// scan; see NoSeqScan for why the claim has no bitmap scans.
//
// A lane row is locked FOR KEY SHARE when the claim visits it and finds a
// deliverable message in it (k reads the lane row, checks the lease
// and locks it): a lane can change owner
// (which takes FOR UPDATE) only between two claim transactions that take
// rows from it, so two relays never work on one lane at once. Empty lanes
// are not locked: a claim of a sparse backlog locks a few lane rows, not
// all of the worker's, and each lock is a write to the lane row (its xmax),
// so WAL and a dirtied page. The probe is a scalar subquery, not EXISTS:
// EXISTS was planned as a scan of the lane's whole index range. Within a
// lane, messages come in id order; a message is held back while an earlier
// message of its key waits for a retry or a delayed delivery (the NOT
// EXISTS probes a partial index that is empty unless something is failing).
// Only this route's waiting messages count: another route's failing sink
// holds back nothing here.

// ClaimParams are a claim's arguments.
type ClaimParams struct {
	// Relay is the claiming relay's id: only lanes it leases are read.
	Relay string
	// Workers and Worker choose the worker's share of those lanes: lane %
	// Workers = Worker.
	Workers, Worker int
	// Rotation is the lane the claim starts at.
	Rotation int
	// Limit is the most rows claimed.
	Limit int
	// LaneLimit is the most rows claimed from one lane (0: Limit). A lower
	// one spreads the batch over more lanes, so over more keys.
	LaneLimit int
	// MaxBytes is the most payload bytes claimed (the first row always
	// goes). The router reads no payloads and ignores it.
	MaxBytes int64
	// MaxMessage is the largest message (payload plus the stored size of
	// its headers) whose content the claim reads; a larger one is claimed
	// without it (empty payload and headers, its Size said): the relay
	// dead-letters it without ever holding it in memory. 0: no limit.
	MaxMessage int64
	// Topics and Exclude are the route's topic patterns and those of
	// earlier routes, in LIKE form with a backslash as the escape; nil: no filter.
	Topics, Exclude []string
	// Handover are lanes this relay is giving up: not claimed.
	Handover []int16
	// Only, when not nil, are the lanes to visit: those the relay leases
	// (of the worker's), or those a wake-up named since the worker's last
	// claim; nil visits every lane of the worker. A claim that visits
	// every lane of the worker probes each for a deliverable row (128
	// index probes for one of two workers), which at low and middle rates
	// cost more than the rows it took; one woken by new rows in a few
	// lanes visits those. Lanes the relay does not lease cost a probe
	// each and are never claimed.
	Only []int16
	// Priority runs the claim with a first phase for priorities: set it
	// while the previous claim's probe (see QueueClaim) found some.
	Priority bool
	// NoProbe leaves the priority probe out (the caller's priority flag
	// keeps its value): for a claim of the few lanes a wake-up named, at
	// rates where each message is a claim of its own and there is no
	// backlog for a priority to overtake. The probe was one statement of
	// five a message at 100 msg/s.
	NoProbe bool
	// Settings is the statement run first in the claim's transaction
	// (TxSettings.SQL); NoSeqScan when empty, unless Session.
	Settings string
	// Session: the claim's session has NoSeqScan's settings for the
	// whole session (PrepareClaims), and Settings is empty: the claim
	// sets nothing in its transaction.
	Session bool
	// Settle are rows of an earlier batch of the same transaction, all
	// delivered: the claim deletes them in its own statement (see
	// claimSettle) instead of a DELETE of their own. The claim then runs
	// in the transaction that claimed them, which the caller has not
	// ended (it queues no BEGIN); empty settles nothing.
	Settle []pgtype.TID
}

// claimsReady is the key of PgConn.CustomData that marks a session
// PrepareClaims set up.
const claimsReady = "outbox-relay.claims"

// PrepareClaims gives c's session NoSeqScan's settings for good, once,
// so that its claims need no statement of their own for them (one of five
// statements a message at 100 msg/s). Run outside a transaction: a
// rollback would undo it. The other statements of the session run under
// the same settings; each has an index made for it, and those that read a
// whole table (the metrics' counts) are planned as index-only scans.
// Never through a transaction-pooling proxy (the settings would stay on a
// backend that others then use).
func PrepareClaims(ctx context.Context, c *pgx.Conn) error {
	if ClaimsPrepared(c) {
		return nil
	}
	if _, err := c.Exec(ctx, noSeqScanSession); err != nil {
		return err
	}
	c.PgConn().CustomData()[claimsReady] = true
	return nil
}

// ClaimsPrepared reports whether PrepareClaims set c's session up.
func ClaimsPrepared(c *pgx.Conn) bool {
	ok, _ := c.PgConn().CustomData()[claimsReady].(bool)
	return ok
}

// lanes are the lanes the claim visits: Only, or every lane of the
// worker.
func (p ClaimParams) lanes() []int16 {
	if p.Only != nil {
		return p.Only
	}
	w := max(p.Workers, 1)
	out := make([]int16, 0, NumLanes/w+1)
	for l := p.Worker; l < NumLanes; l += w {
		out = append(out, int16(l))
	}
	return out
}

// ClaimedRow is one claimed message, as stored.
type ClaimedRow struct {
	// Seq is the row's id (the message's position); ID is the message id.
	Seq     int64
	ID      string
	Topic   string
	Key     string // "" for NULL
	Payload []byte // empty for the router
	Headers []byte // jsonb; "{}" for the router
	// CreatedAt may be ±infinity in a row written by hand.
	CreatedAt pgtype.Timestamptz
	Attempts  int
	// ClaimedAt is the claim's database time.
	ClaimedAt time.Time
	// Found is how many rows the claim took before the byte limit cut
	// the batch: more than the rows it returned when the cut left some
	// for the next claim. The router's claim has no cut: Found is 0.
	Found int
	// CTID is the row's physical address, stable while the claim's
	// transaction holds its lock: settlement finds the row by it.
	CTID pgtype.TID
	// Lane is the row's lane: a worker with batches in flight claims
	// the next one from the others.
	Lane int16
	// Size is the message's size as ClaimParams.MaxMessage weighs it;
	// above that limit Payload and Headers were not read. The router's
	// claim does not weigh: 0.
	Size int64
}

// NoSeqScan is run in a claim's transaction and in those of the
// watcher's looks (set_config(…, true) is SET LOCAL: it ends with the
// transaction) before their statements are planned. The relay's
// statements run as prepared statements, and Postgres plans a prepared
// statement once for all (a generic plan)
// with the table's size at that moment; the outbox is nearly empty most
// of the time, so the plan read it with sequential scans, and kept them
// when a backlog came (a writer's bulk insert, a sink's outage): measured,
// a relay running on an empty outbox took 44 s for its first claim of a
// 200k backlog, sequentially scanning the whole table once per row it
// claimed (the held-back check), where a relay started on the backlog
// drained all of it in 6 s. Every statement of the claim and of the
// watcher has an index made for it, and the plans this setting leaves are
// the ones TestClaimPlanStaysNarrow checks.
//
// It turns bitmap scans off as well. The outbox's live rows are few
// most of the time and its dead ones many: every delivered row stays in
// the table and its indexes until a vacuum, and autovacuum comes at most
// once a minute. Planned for the few live rows a lane holds, a lane's
// probe and its rows were read as a bitmap scan of the lane's index range
// and a sort, which fetches every heap tuple of the range, dead ones
// included, at every claim, and never marks an index entry dead. An index
// scan in id order stops at the first deliverable row and marks the dead
// entries it passes, so the next claim steps over them without reading
// the heap. Measured with 16 writers at full speed and one relay
// draining (scripts/writers-beside-relay.sh: throwaway cluster,
// pg_stat_statements, 8 s): 2.7 ms and 100 buffers per claimed row with
// bitmap scans, 0.6 ms and 14 without; TestClaimPlanOnDeadRows holds the
// plan.
//
// It also turns JIT compilation off for the transaction: the setting
// works by adding a huge cost to every sequential scan, and a plan that
// cannot avoid one (a tiny table without a usable index) then costs more
// than jit_above_cost, so Postgres compiled it at every execution:
// measured, 100 ms of compiling for a 0.2 ms statement. No statement of
// the relay's is large enough for JIT to pay.
const NoSeqScan = "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true)"

// Begin begins every transaction of the relay's: read committed whatever
// the database's default_transaction_isolation (a DBA's serializable
// default made heartbeats fail with serialization errors).
const Begin = "BEGIN ISOLATION LEVEL READ COMMITTED"

// TxSettings are the settings a claim's transaction runs under, set in it
// (SET LOCAL) rather than on the session: through a transaction-pooling
// proxy (PgBouncer) session settings reach a backend that other clients
// then use, and the proxy refuses them as startup parameters. They bound
// what a relay that stops mid-batch (frozen, partitioned) can hold.
type TxSettings struct {
	// IdleInTransaction aborts the transaction of a relay that stops
	// talking to the database mid-batch, freeing its rows.
	IdleInTransaction time.Duration
	// Statement and Lock bound each statement and each lock wait.
	Statement, Lock time.Duration
}

// SQL is the statement that sets s, and NoSeqScan's settings, in the
// current transaction.
func (s TxSettings) SQL() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("'%d'", d.Milliseconds()) }
	return NoSeqScan +
		", set_config('idle_in_transaction_session_timeout', " + ms(s.IdleInTransaction) + ", true)" +
		", set_config('statement_timeout', " + ms(s.Statement) + ", true)" +
		", set_config('lock_timeout', " + ms(s.Lock) + ", true)"
}

// QueueClaim queues a claim on b: the priority probe (except for the
// router, which copies in id order whatever the priority: the
// destinations' claims honour it) and the claim itself. When b's results
// are read, *priority is set to the probe's answer (the worker's lanes
// hold deliverable messages with a priority: its next claim should set
// ClaimParams.Priority) and row is called for each claimed row, in claim
// order; an error from row ends the batch with it. The caller begins the
// transaction first and settles it after: the claimed rows stay locked
// until then.
func (e *Engine) QueueClaim(b *pgx.Batch, p ClaimParams, priority *bool, row func(ClaimedRow) error) {
	switch {
	case p.Settings != "":
		b.Queue(p.Settings)
	case !p.Session:
		b.Queue(NoSeqScan)
	}
	handover := p.Handover
	if handover == nil {
		handover = []int16{} // NULL would exclude every lane
	}
	laneLimit := p.LaneLimit
	if laneLimit <= 0 || laneLimit > p.Limit {
		laneLimit = p.Limit
	}
	maxMessage := p.MaxMessage
	if maxMessage <= 0 {
		maxMessage = math.MaxInt64
	}
	args := pgx.NamedArgs{
		"relay": p.Relay, "workers": p.Workers, "worker": p.Worker, "rotation": p.Rotation,
		"limit": p.Limit, "lane_limit": laneLimit, "max_bytes": p.MaxBytes, "topics": p.Topics, "exclude": p.Exclude,
		"handover": handover, "lanes": p.lanes(), "max_message": maxMessage,
	}
	claim := e.claim
	if len(p.Settle) > 0 {
		if e.source == Router || p.Priority {
			// Neither claim has the settling form: the DELETE goes ahead
			// of it, in the same transaction.
			e.QueueDelete(b, p.Settle)
		} else {
			claim = e.claimSettle
			args["settle"] = p.Settle
		}
	}
	if e.source != Router && !p.NoProbe {
		b.Queue(e.hasPriority.sql, e.args(e.hasPriority, args)...).QueryRow(func(r pgx.Row) error {
			if err := r.Scan(priority); err != nil {
				return fmt.Errorf("priority probe: %w", err)
			}
			return nil
		})
	}
	if e.source != Router && p.Priority {
		claim = e.claimPriority
	}
	b.Queue(claim.sql, e.args(claim, args)...).Query(func(rows pgx.Rows) error {
		// One ClaimedRow serves every row: pgx scans each value into
		// fresh memory, and row gets a copy.
		var c ClaimedRow
		dest := []any{&c.Seq, &c.ID, &c.Topic, &c.Key, &c.Payload, &c.Headers,
			&c.CreatedAt, &c.Attempts, &c.ClaimedAt, &c.CTID, &c.Lane}
		if e.source != Router {
			dest = append(dest, &c.Size, &c.Found)
		}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			if err := row(c); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// msgSize is the size of the message in row alias a as the max-message
// limit weighs it: its payload's length and its headers' stored size.
// Both are read from the row's header or its TOAST pointer: a large
// payload is not detoasted to be weighed.
func msgSize(a string) string {
	return "(octet_length(" + a + ".payload)::bigint + pg_column_size(" + a + ".headers))"
}

// oversize is true of a message too large for the relay to read
// (@max_message): the claim returns it without payload and headers, and
// the relay dead-letters it, so that a row no sink could take, written by
// a writer that checks nothing (plain SQL, outbox.enqueue), never has to
// fit in the relay's memory. a is a claimed row, whose msg_size the
// claim's lateral computed once.
func oversize(a string) string { return a + ".msg_size > @max_message" }

// readSize is what the claim reads of the payload in row alias a: nothing
// of an oversize message.
func readSize(a string) string {
	return "CASE WHEN " + oversize(a) + " THEN 0 ELSE octet_length(" + a + ".payload) END"
}

// topicFilter is the route's topic condition on the row alias a.
func topicFilter(a string) string {
	return "(@topics::text[] IS NULL OR " + a + ".topic LIKE ANY(@topics)) AND (@exclude::text[] IS NULL OR NOT " + a + ".topic LIKE ANY(@exclude))"
}

// notHeld is true of the row m when no earlier message of its key in this
// route waits for a retry or a delayed delivery.
func (e *Engine) notHeld(src string) string {
	return `NOT EXISTS (
          SELECT 1 FROM ` + src + ` w
          WHERE ` + e.ofRoute("w") + `w.key = m.key AND w.id < m.id
            AND ` + Waiting("w") + `
            AND ` + topicFilter("w") + `)`
}

func (e *Engine) renderClaim(s Schema) {
	src := e.table(s)
	from := e.claimFrom(s, false)
	if e.source == Router {
		// The router copies rows inside the database: it reads neither
		// payloads nor headers, and weighs nothing.
		e.claim = newStmt(atStatement(`
SELECT m.id, m.message_id::text AS message_id, m.topic, coalesce(m.key, '') AS key, '\x'::bytea AS payload, '{}'::jsonb AS headers,
       m.created_at, m.attempts, now() AS claimed_at, m.row_ctid, m.lane` + from + `
LIMIT @limit`))
		return
	}
	// rows are the columns a claim returns (ClaimedRow's). A message over
	// @max_message is claimed without its content (see oversize).
	rows := `
SELECT m.id, m.message_id::text AS message_id, m.topic, coalesce(m.key, '') AS key,
       CASE WHEN ` + oversize("m") + ` THEN '\x'::bytea ELSE m.payload END AS payload,
       CASE WHEN ` + oversize("m") + ` THEN '{}'::jsonb ELSE m.headers END AS headers,
       m.created_at, m.attempts, now() AS claimed_at, m.row_ctid, m.lane, m.msg_size`
	// What byteCut orders and weighs the rows by: pos and lane (the claim
	// order, with id), size (what the claim reads of the payload).
	weighed := rows + `, o.pos, ` + readSize("m") + ` AS size`
	e.claim = newStmt(atStatement(byteCut(weighed + from + `
LIMIT @limit`)))
	e.claimSettle = newStmt(atStatement(claimSettle(src, byteCut(weighed+e.claimFrom(s, true)+`
LIMIT @limit`))))
	e.claimPriority = newStmt(atStatement(e.priorityClaim(s, rows, weighed+from)))

	// The probe of the partial priority index (empty unless someone sets
	// priorities) for this worker's lanes.
	e.hasPriority = newStmt(atStatement(`SELECT EXISTS (SELECT 1 FROM ` + src + ` p
    WHERE ` + e.ofRoute("p") + `p.priority > 0 AND p.lane % @workers = @worker
      AND ` + Ready("p") + `
      AND ` + topicFilter("p") + `)`))
}

// atStatement makes a claim's clock the statement's start
// (statement_timestamp()) instead of its transaction's (now()): which
// rows are due, which are held back behind a waiting retry, whether a
// lease still holds. A claim may run in a transaction that began with an
// earlier claim (see claimSettle): with the transaction's clock a retry
// that came due since then was not due to it, while the watcher, which
// woke the lane for that row, had moved on (a lane left waiting until
// the safety poll). In a transaction of its own both clocks are the same
// instant but for the round trip's BEGIN.
func atStatement(sql string) string {
	return strings.ReplaceAll(sql, "now()", "statement_timestamp()")
}

// claimSettle is the claim whose statement also deletes the rows
// @settle, delivered from an earlier batch of its transaction: the
// delete is a statement of its own otherwise, one a batch, as many as
// the claims at live rates (where a batch is a message or a few). The
// claim passes over those rows itself (claim renders it with them
// excluded): a data-modifying WITH runs beside the query, in no set
// order, and the transaction already holds their locks, so the claim's
// FOR UPDATE would take them again if it came first.
func claimSettle(src, claim string) string {
	return `
WITH settled AS (DELETE FROM ` + src + ` WHERE ctid = ANY(@settle::tid[]))` + claim
}

// claimFrom renders the plain claim's source rows, without a LIMIT:
// this worker's lanes in rotation order (pos), each lane's deliverable
// messages in id order. Shared by the claim, the gated branch of the
// priority claim and the router's claim. (256 is NumLanes.) settling:
// the rows @settle are left out (see claimSettle).
func (e *Engine) claimFrom(s Schema, settling bool) string {
	src := e.table(s)
	notSettled := func(a string) string {
		if !settling {
			return ""
		}
		return ` AND NOT (` + a + `.ctid = ANY(@settle::tid[]))`
	}
	return `
FROM (
    SELECT l.lane, (l.lane + 256 - @rotation) % 256 AS pos FROM unnest(@lanes::int2[]) l(lane)
    WHERE l.lane % @workers = @worker AND NOT (l.lane = ANY(@handover::int2[]))
    ORDER BY pos
) o
CROSS JOIN LATERAL (
    SELECT k.lane FROM ` + s.Table("lanes") + ` k
    WHERE k.route = @route AND k.lane = o.lane AND k.owner = @relay AND k.lease_until > now()
      AND (SELECT true FROM ` + src + ` e
          WHERE ` + e.ofRoute("e") + `e.lane = o.lane AND ` + Ready("e") + ` AND ` + topicFilter("e") + notSettled("e") + `
          ORDER BY e.id LIMIT 1)
    FOR KEY SHARE
) k
CROSS JOIN LATERAL (
    SELECT m.*, m.ctid AS row_ctid, ` + msgSize("m") + ` AS msg_size FROM ` + src + ` m
    WHERE ` + e.ofRoute("m") + `m.lane = o.lane
      AND ` + Ready("m") + `
      AND ` + topicFilter("m") + notSettled("m") + `
      AND ` + e.notHeld(src) + `
    ORDER BY m.id
    LIMIT @lane_limit
    FOR UPDATE
) m`
}

// priorityClaim is the claim with a first phase: when the worker's lanes hold
// deliverable messages with priority > 0 (found through a partial
// index), the batch is made of the messages of those messages' keys
// only, lanes with the highest priority first, each key in id order: a
// priority message overtakes the other keys' backlog, never an earlier
// message of its own key. The plain claim (a gated branch, not executed
// at all when the first phase found rows) runs only when the first
// phase finds nothing. It costs more than the plain claim even without
// priority rows (measured: +9%, mostly a worse generic plan), so a
// worker runs it only while the probe, pipelined with every claim, says
// there are priority messages in its lanes. The byte limit cuts either
// phase's rows in the order they were claimed (-priority, lane, id for
// the first).
//
// rows are the claim's columns, plain the plain claim without its LIMIT.
func (e *Engine) priorityClaim(s Schema, rows, plain string) string {
	src := e.table(s)
	return `
WITH pl AS MATERIALIZED (
    SELECT l.lane, k.prio FROM (
        SELECT p.lane, max(p.priority) AS prio FROM ` + src + ` p
        WHERE ` + e.ofRoute("p") + `p.priority > 0 AND p.lane % @workers = @worker
          AND ` + Ready("p") + `
          AND ` + topicFilter("p") + `
        GROUP BY p.lane
    ) k
    JOIN ` + s.Table("lanes") + ` l ON l.route = @route AND l.lane = k.lane
    WHERE l.owner = @relay AND l.lease_until > now() AND NOT (l.lane = ANY(@handover::int2[]))
    ORDER BY k.prio DESC, l.lane
    FOR KEY SHARE OF l
), pm AS MATERIALIZED (` + rows + `, -pl.prio AS pos, ` + readSize("m") + ` AS size
    FROM pl CROSS JOIN LATERAL (
        SELECT m.*, m.ctid AS row_ctid, ` + msgSize("m") + ` AS msg_size FROM ` + src + ` m
        WHERE ` + e.ofRoute("m") + `m.lane = pl.lane
          AND ` + Ready("m") + `
          AND ` + topicFilter("m") + `
          AND (m.priority > 0 OR m.key IN (
              SELECT pk.key FROM ` + src + ` pk
              WHERE ` + e.ofRoute("pk") + `pk.lane = pl.lane AND pk.priority > 0 AND ` + topicFilter("pk") + `))
          AND ` + e.notHeld(src) + `
        ORDER BY m.id
        LIMIT @limit
        FOR UPDATE
    ) m
    LIMIT @limit
)
` + byteCut(`
SELECT * FROM pm
UNION ALL`+plain+`
WHERE NOT EXISTS (SELECT 1 FROM pm)
LIMIT @limit`)
}

// byteCut keeps the longest prefix of a claim's rows (src, at most @limit
// of them, each with lane, pos and size columns) whose payloads add up to
// at most @max_bytes, and always the first row: a message above the limit
// goes alone. The prefix is taken in claim order (pos, lane, id), so when a
// message is cut every later message of its lane, and so of its key, is
// cut too. Cut rows stay locked until the claim's transaction ends
// (harmless: the lanes are this worker's) and come back in the next claim;
// the found column (on every row) counts the rows before the cut, so that
// the worker knows whether the cut left some to come back for at once.
// octet_length of a stored bytea reads its length without detoasting it:
// payloads beyond the cut never leave the database.
func byteCut(src string) string {
	return `
SELECT c.id, c.message_id, c.topic, c.key, c.payload, c.headers, c.created_at, c.attempts, c.claimed_at, c.row_ctid, c.lane, c.msg_size, c.found
FROM (
    SELECT c.*, sum(c.size) OVER w AS run, row_number() OVER w AS n, count(*) OVER () AS found
    FROM (` + src + `
    ) c
    WINDOW w AS (ORDER BY c.pos, c.lane, c.id ROWS UNBOUNDED PRECEDING)
) c
WHERE c.run <= @max_bytes OR c.n = 1
ORDER BY c.pos, c.lane, c.id`
}
