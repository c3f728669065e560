package relay

import (
	"strings"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// numLanes is fixed by migration 001 (the lanes table and the lane column).
const numLanes = 256

// queries holds every SQL statement the relay runs, rendered once for a
// schema. The schema name is quoted with pgx.Identifier; nothing else is
// ever spliced into SQL.
type queries struct {
	claim, claimPriority, hasPriority, deleteDelivered, archiveDelivered, scheduleRetry, deadLetter string
	// relock locks a batch's rows $1 again (for settleApart), by id
	// (their ctids are unchanged unless another relay took them).
	relock string
	// routerClaim is claim for the fan-out router, which copies rows
	// inside the database and needs neither payloads nor headers.
	routerClaim string

	// copyToRoutes is the fan-out router's: copy messages $1 to routes $2
	// (one pair per copy); $3 are the messages' ctids.
	copyToRoutes string

	ensureLanes, heartbeat, clampHeartbeats, reap, renew, countRelays, acquire, release, releaseAll, unregister string
	// workedLanes counts the route's lanes that a live relay has leased.
	workedLanes string
	// owned lists the lanes relay $1 owns in route $2.
	owned string
}

// topicFilter is the route's topic condition on the row alias a: $7 are
// its patterns, $8 those of earlier routes (NULL: no filter).
func topicFilter(a string) string {
	return "($7::text[] IS NULL OR " + a + ".topic LIKE ANY($7)) AND ($8::text[] IS NULL OR NOT " + a + ".topic LIKE ANY($8))"
}

// notHeld is true of the row m when no earlier message of its key in this
// route waits for a retry or a delayed delivery.
func notHeld(table, route string) string {
	return `NOT EXISTS (
          SELECT 1 FROM ` + table + ` w
          WHERE ` + route + `w.key = m.key AND w.id < m.id
            AND w.available_at IS NOT NULL AND w.available_at > now()
            AND ` + topicFilter("w") + `)`
}

// newQueries renders the statements for schema. With deliveries the relay
// works on the fan-out copies of its route ($6) in the deliveries table
// instead of the outbox itself.
func newQueries(schema string, deliveries bool) queries {
	s := migrations.Ident(schema)
	src := s + ".messages"
	// rc restricts a row alias of the source to this route's copies.
	rc := func(string) string { return "" }
	// deadRoute is what a dead letter records as its route: '' for a
	// message of the outbox (a replay routes it again), the destination
	// for a fan-out copy (a replay goes to that route only).
	deadRoute, retryRoute, archiveRoute, archiveOnly, relockRoute := "''", "", "$2::text", "", ""
	if deliveries {
		archiveOnly, relockRoute = "m.route = $2 AND ", " AND m.route = $2"
		src = s + ".deliveries"
		rc = func(a string) string { return a + ".route = $6 AND " }
		deadRoute, retryRoute = "$4::text", " AND m.route = $4"
	}
	// The plain claim's source rows, without a LIMIT: this worker's lanes
	// in rotation order (pos), each lane's deliverable messages in id
	// order. Shared by claim, the gated branch of claimPriority and the
	// router's claim.
	from := `
FROM (
    SELECT l.lane, (l.lane + 256 - $4) % 256 AS pos FROM ` + s + `.lanes l
    WHERE l.route = $6 AND l.owner = $1 AND l.lease_until > now() AND l.lane % $2 = $3
      AND NOT (l.lane = ANY($9::int2[]))
    ORDER BY pos
    FOR KEY SHARE
) o
CROSS JOIN LATERAL (
    SELECT m.*, m.ctid AS row_ctid FROM ` + src + ` m
    WHERE ` + rc("m") + `m.lane = o.lane
      AND (m.available_at IS NULL OR m.available_at <= now())
      AND ` + topicFilter("m") + `
      AND ` + notHeld(src, rc("w")) + `
    ORDER BY m.id
    LIMIT $5
    FOR UPDATE
) m`
	// rows are the columns a claim returns, plus what byteCut orders and
	// weighs them by: pos and lane (the claim order, with id), size.
	const rows = `
SELECT m.id, m.message_id::text AS message_id, m.topic, coalesce(m.key, '') AS key, m.payload, m.headers,
       m.created_at, m.attempts, now() AS claimed_at, m.row_ctid`
	plain := rows + `, o.pos, m.lane, octet_length(m.payload) AS size` + from
	q := queries{
		// Claim up to $5 deliverable messages, and at most $10 payload bytes
		// (but always the first message), from the lanes this worker owns
		// in route $6 ($1 = relay id, lanes with lane % $2 = $3), starting
		// at lane $4 so that every lane gets its turn. $7 and $8 are the
		// route's topic patterns (LIKE form) and those of earlier routes;
		// NULL means no filter. $9 are lanes being handed over to another
		// relay: not claimed any more.
		//
		// The lane rows are locked FOR KEY SHARE as they are visited: a lane
		// can change owner (which takes FOR UPDATE) only between two claim
		// transactions, so two relays never work on one lane at once. Within
		// a lane, messages come in id order; a message is held back while an
		// earlier message of its key waits for a retry (the NOT EXISTS probes
		// a partial index that is empty unless something is failing). Only
		// this route's waiting messages count: another route's failing sink
		// holds back nothing here.
		claim: byteCut(plain + `
LIMIT $5`),

		// claimPriority is claim with a first phase for priorities: when
		// the worker's lanes hold deliverable messages with priority > 0
		// (found through a partial index), the batch is made of the messages
		// of those messages' keys only, lanes with the highest priority
		// first, each key in id order: a priority message overtakes the
		// other keys' backlog, never an earlier message of its own key. The
		// plain claim (a gated branch, not executed at all when the first
		// phase found rows) runs only when the first phase finds nothing.
		// It costs more than the plain claim even without priority rows
		// (measured: +9%, mostly a worse generic plan), so a worker runs it
		// only while hasPriority, pipelined with every claim, says there
		// are priority messages in its lanes. The byte limit cuts either
		// phase's rows in the order they were claimed (-priority, lane, id
		// for the first).
		claimPriority: `
WITH pl AS MATERIALIZED (
    SELECT l.lane, k.prio FROM (
        SELECT p.lane, max(p.priority) AS prio FROM ` + src + ` p
        WHERE ` + rc("p") + `p.priority > 0 AND p.lane % $2 = $3
          AND (p.available_at IS NULL OR p.available_at <= now())
          AND ` + topicFilter("p") + `
        GROUP BY p.lane
    ) k
    JOIN ` + s + `.lanes l ON l.route = $6 AND l.lane = k.lane
    WHERE l.owner = $1 AND l.lease_until > now() AND NOT (l.lane = ANY($9::int2[]))
    ORDER BY k.prio DESC, l.lane
    FOR KEY SHARE OF l
), pm AS MATERIALIZED (` + rows + `, -pl.prio AS pos, m.lane, octet_length(m.payload) AS size
    FROM pl CROSS JOIN LATERAL (
        SELECT m.*, m.ctid AS row_ctid FROM ` + src + ` m
        WHERE ` + rc("m") + `m.lane = pl.lane
          AND (m.available_at IS NULL OR m.available_at <= now())
          AND ` + topicFilter("m") + `
          AND (m.priority > 0 OR m.key IN (
              SELECT pk.key FROM ` + src + ` pk
              WHERE ` + rc("pk") + `pk.lane = pl.lane AND pk.priority > 0 AND ` + topicFilter("pk") + `))
          AND ` + notHeld(src, rc("w")) + `
        ORDER BY m.id
        LIMIT $5
        FOR UPDATE
    ) m
    LIMIT $5
)
` + byteCut(`
SELECT * FROM pm
UNION ALL`+plain+`
WHERE NOT EXISTS (SELECT 1 FROM pm)
LIMIT $5`),

		// The fan-out router copies rows inside the database: it needs
		// neither payloads nor headers, so it has no byte limit either.
		routerClaim: rows + from + `
LIMIT $5`,

		// hasPriority probes the partial priority index (empty unless
		// someone sets priorities) for this worker's lanes ($1 workers, $2
		// worker, $3 and $4 the topic patterns, $5 the route of copies).
		hasPriority: `SELECT EXISTS (SELECT 1 FROM ` + src + ` p
    WHERE ` + strings.ReplaceAll(rc("p"), "$6", "$5") + `p.priority > 0 AND p.lane % $1 = $2
      AND (p.available_at IS NULL OR p.available_at <= now())
      AND ` + strings.NewReplacer("$7", "$3", "$8", "$4").Replace(topicFilter("p")) + `)`,

		// By ctid: the rows are locked by this transaction since the claim,
		// so their physical address cannot change, and a TID scan saves a
		// primary-key descent per row.
		deleteDelivered: `DELETE FROM ` + src + ` WHERE ctid = ANY($1::tid[])`,

		relock: `SELECT m.id, m.ctid FROM ` + src + ` m WHERE m.id = ANY($1)` + relockRoute + ` FOR UPDATE SKIP LOCKED`,

		// With --archive, delivered rows move to the day's archive
		// partition in the same statement.
		archiveDelivered: `
WITH d AS (
    DELETE FROM ` + src + ` m WHERE ` + archiveOnly + `id = ANY($1)
    RETURNING id, message_id, topic, key, payload, headers, created_at
)
INSERT INTO ` + s + `.archive (id, message_id, topic, key, payload, headers, created_at, delivered_at, route)
SELECT id, message_id, topic, key, payload, headers, created_at, now(), ` + archiveRoute + ` FROM d`,

		scheduleRetry: `
UPDATE ` + src + ` m SET
    attempts = m.attempts + 1,
    available_at = clock_timestamp() + f.delay_ms * interval '1 millisecond',
    last_error = f.err,
    first_error = coalesce(m.first_error, f.err),
    first_failed_at = coalesce(m.first_failed_at, clock_timestamp())
FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS f(id, delay_ms, err)
WHERE m.id = f.id` + retryRoute,

		deadLetter: `
WITH f AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[]) AS f(id, reason, err)
), d AS (
    DELETE FROM ` + src + ` m USING f WHERE m.id = f.id` + retryRoute + `
    RETURNING m.*, f.reason, f.err
)
INSERT INTO ` + s + `.dead_letters
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
    dedup_key = EXCLUDED.dedup_key, priority = EXCLUDED.priority, dead_at = now()`,

		// copyToRoutes reads the claimed rows by ctid ($3; they are locked,
		// so it is stable). No ON CONFLICT: a message is copied in the
		// transaction that removes it from the outbox, so a copy can only
		// exist already if ids were reused by hand, and then failing loudly
		// beats dropping a copy (the statement is also a third cheaper).
		copyToRoutes: `
INSERT INTO ` + s + `.deliveries
    (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
SELECT d.route, m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at, m.dedup_key, m.priority
FROM (SELECT * FROM ` + s + `.messages WHERE ctid = ANY($3::tid[])) m
JOIN unnest($1::bigint[], $2::text[]) AS d(id, route) ON d.id = m.id`,

		ensureLanes: `INSERT INTO ` + s + `.lanes (route, lane) SELECT $1, g FROM generate_series(0, 255) AS g ON CONFLICT DO NOTHING`,

		heartbeat: `
INSERT INTO ` + s + `.relays (id, hostname, pid, version, route, in_flight, backend_pid, backend_start)
SELECT $1, $2, $3, $4, $5, $6, pg_backend_pid(), a.backend_start
FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), in_flight = EXCLUDED.in_flight,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start`,

		// Heartbeats are written with the database's now(); one in the
		// future was written by hand (or the server's clock stepped back).
		// It is set to now, so that it ages like any other: a row with
		// heartbeat 'infinity' would otherwise count as a live relay
		// forever, and its fair share of the lanes would never be worked.
		// Locked rows are skipped, as in reap.
		clampHeartbeats: `
UPDATE ` + s + `.relays SET heartbeat_at = now()
WHERE id IN (
    SELECT id FROM ` + s + `.relays WHERE id <> $1 AND heartbeat_at > clock_timestamp()
    FOR UPDATE SKIP LOCKED)`,

		// A relay is dead when its heartbeat is older than the lease TTL or,
		// with fast failover, when its lease connection no longer exists
		// (its process died and the server noticed the closed socket).
		//
		// Rows locked by another transaction are skipped: that is a relay
		// writing its heartbeat right now, alive, whose new backend pid this
		// snapshot may not show yet (after its connection was replaced).
		// Waiting for it instead deadlocked relays that all reconnected at
		// once (each one's reap waiting for the other's heartbeat), which
		// stalled whole routes in the fan-out chaos test.
		reap: `
DELETE FROM ` + s + `.relays WHERE id IN (
    SELECT r.id FROM ` + s + `.relays r
    WHERE r.id <> $1 AND (
        r.heartbeat_at < now() - $2 * interval '1 millisecond'
        OR ($3 AND NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
            WHERE a.pid = r.backend_pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start))))
    FOR UPDATE SKIP LOCKED)`,

		renew: `UPDATE ` + s + `.lanes SET lease_until = now() + $2 * interval '1 millisecond' WHERE route = $3 AND owner = $1 RETURNING lane`,

		// Relays alive in this route, and this relay's rank among them, for
		// the fair share; and how many lane rows the route has (256 unless
		// someone deleted some: then they are created again).
		countRelays: `SELECT count(*), count(*) FILTER (WHERE id < $1),
    (SELECT count(*) FROM ` + s + `.lanes WHERE route = $2)
FROM ` + s + `.relays WHERE route = $2`,

		workedLanes: `
SELECT count(*) FROM ` + s + `.lanes l
WHERE l.route = $1 AND l.owner IS NOT NULL AND l.lease_until > now()
  AND EXISTS (SELECT 1 FROM ` + s + `.relays r WHERE r.id = l.owner)`,

		acquire: `
UPDATE ` + s + `.lanes SET owner = $1, lease_until = now() + $2 * interval '1 millisecond'
WHERE lane IN (
    SELECT l.lane FROM ` + s + `.lanes l
    WHERE l.route = $4 AND (l.owner IS NULL OR l.lease_until < now()
       OR NOT EXISTS (SELECT 1 FROM ` + s + `.relays r WHERE r.id = l.owner))
    ORDER BY l.lane
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
  AND route = $4
RETURNING lane`,

		// Hand lanes $2 back, skipping any that a claim transaction is
		// using right now (they go on a later heartbeat).
		release: `
UPDATE ` + s + `.lanes SET owner = NULL, lease_until = NULL
WHERE lane IN (
    SELECT l.lane FROM ` + s + `.lanes l WHERE l.route = $3 AND l.owner = $1 AND l.lane = ANY($2::int2[])
    FOR UPDATE SKIP LOCKED)
  AND route = $3
RETURNING lane`,

		releaseAll: `UPDATE ` + s + `.lanes SET owner = NULL, lease_until = NULL WHERE route = $2 AND owner = $1`,
		unregister: `DELETE FROM ` + s + `.relays WHERE id = $1`,
		owned:      `SELECT lane FROM ` + s + `.lanes WHERE route = $2 AND owner = $1`,
	}
	q.routerClaim = strings.Replace(q.routerClaim, "m.payload, m.headers,", `'\x'::bytea, '{}'::jsonb,`, 1)
	return q
}

// byteCut keeps the longest prefix of a claim's rows (src, at most $5 of
// them, each with pos, lane and size columns) whose payloads add up to at
// most $10 bytes, and always the first row: a message above the limit goes
// alone. The prefix is taken in claim order (pos, lane, id), so when a
// message is cut every later message of its lane, and so of its key, is cut
// too. Cut rows stay locked until the claim's transaction ends (harmless:
// the lanes are this worker's) and come back in the next claim. octet_length
// of a stored bytea reads its length without detoasting it: payloads beyond
// the cut never leave the database.
func byteCut(src string) string {
	return `
SELECT c.id, c.message_id, c.topic, c.key, c.payload, c.headers, c.created_at, c.attempts, c.claimed_at, c.row_ctid
FROM (
    SELECT c.*, sum(c.size) OVER w AS run, row_number() OVER w AS n
    FROM (` + src + `
    ) c
    WINDOW w AS (ORDER BY c.pos, c.lane, c.id ROWS UNBOUNDED PRECEDING)
) c
WHERE c.run <= $10 OR c.n = 1
ORDER BY c.pos, c.lane, c.id`
}
