WITH f AS (
    SELECT 'm' AS src, * FROM (SELECT '' AS route, m.topic, m.id, m.message_id, m.last_error, m.first_failed_at, m.available_at
      FROM "outbox"."messages" m
      WHERE (m.available_at IS NOT NULL AND m.attempts > 0 AND m.held_since IS NULL)
      ORDER BY m.available_at LIMIT @scan) x
    UNION ALL
    SELECT 'c', * FROM (SELECT c.route AS route, c.topic, c.id, c.message_id, c.last_error, c.first_failed_at, c.available_at
      FROM "outbox"."deliveries" c
      WHERE (c.available_at IS NOT NULL AND c.attempts > 0 AND c.held_since IS NULL)
      ORDER BY c.available_at LIMIT @scan) y
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
LIMIT @limit
