WITH settled AS (DELETE FROM "outbox"."messages" WHERE ctid = ANY(@settle::tid[]))
SELECT c.id, c.message_id, c.topic, c.key, c.payload, c.headers, c.created_at, c.attempts, c.claimed_at, c.row_ctid, c.lane, c.msg_size, c.found
FROM (
    SELECT c.*, sum(c.size) OVER w AS run, row_number() OVER w AS n, count(*) OVER () AS found
    FROM (
SELECT m.id, m.message_id::text AS message_id, m.topic, coalesce(m.key, '') AS key,
       CASE WHEN m.msg_size > @max_message THEN '\x'::bytea ELSE m.payload END AS payload,
       CASE WHEN m.msg_size > @max_message THEN '{}'::jsonb ELSE m.headers END AS headers,
       m.created_at, m.attempts, statement_timestamp() AS claimed_at, m.row_ctid, m.lane, m.msg_size, o.pos, CASE WHEN m.msg_size > @max_message THEN 0 ELSE octet_length(m.payload) END AS size
FROM (
    SELECT l.lane, (l.lane + 256 - @rotation) % 256 AS pos FROM unnest(@lanes::int2[]) l(lane)
    WHERE l.lane % @workers = @worker AND NOT (l.lane = ANY(@handover::int2[]))
    ORDER BY pos
) o
CROSS JOIN LATERAL (
    SELECT k.lane FROM "outbox"."lanes" k
    WHERE k.route = @route AND k.lane = o.lane AND k.owner = @relay AND k.lease_until > statement_timestamp()
      AND (SELECT true FROM "outbox"."messages" e
          WHERE e.lane = o.lane AND (e.available_at IS NULL OR e.available_at <= statement_timestamp()) AND (@topics::text[] IS NULL OR e.topic LIKE ANY(@topics)) AND (@exclude::text[] IS NULL OR NOT e.topic LIKE ANY(@exclude)) AND NOT (e.ctid = ANY(@settle::tid[]))
          ORDER BY e.id LIMIT 1)
    FOR KEY SHARE
) k
CROSS JOIN LATERAL (
    SELECT m.*, m.ctid AS row_ctid, (octet_length(m.payload)::bigint + pg_column_size(m.headers)) AS msg_size FROM "outbox"."messages" m
    WHERE m.lane = o.lane
      AND (m.available_at IS NULL OR m.available_at <= statement_timestamp())
      AND (@topics::text[] IS NULL OR m.topic LIKE ANY(@topics)) AND (@exclude::text[] IS NULL OR NOT m.topic LIKE ANY(@exclude)) AND NOT (m.ctid = ANY(@settle::tid[]))
      AND NOT EXISTS (
          SELECT 1 FROM "outbox"."messages" w
          WHERE w.key = m.key AND w.id < m.id
            AND (w.available_at IS NOT NULL AND w.available_at > statement_timestamp())
            AND (@topics::text[] IS NULL OR w.topic LIKE ANY(@topics)) AND (@exclude::text[] IS NULL OR NOT w.topic LIKE ANY(@exclude)))
    ORDER BY m.id
    LIMIT @lane_limit
    FOR UPDATE
) m
LIMIT @limit
    ) c
    WINDOW w AS (ORDER BY c.pos, c.lane, c.id ROWS UNBOUNDED PRECEDING)
) c
WHERE c.run <= @max_bytes OR c.n = 1
ORDER BY c.pos, c.lane, c.id
