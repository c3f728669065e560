WITH w AS (
    SELECT count(*) FILTER (WHERE (u.available_at IS NOT NULL AND u.attempts > 0 AND u.held_since IS NULL)) retrying, count(*) FILTER (WHERE (u.attempts = 0 AND (u.available_at IS NOT NULL AND u.available_at > now()) AND u.held_since IS NULL)) delayed,
           count(*) FILTER (WHERE (u.held_since IS NOT NULL)) parked
    FROM (SELECT attempts, available_at, held_since FROM "outbox"."messages" WHERE available_at IS NOT NULL
          UNION ALL SELECT attempts, available_at, held_since FROM "outbox"."deliveries" WHERE available_at IS NOT NULL) u
), p AS MATERIALIZED (
    SELECT (SELECT count(*) FROM "outbox"."messages") + (SELECT count(*) FROM "outbox"."deliveries") - w.parked AS n FROM w
)
SELECT p.n, p.n - w.retrying - w.delayed, w.retrying, w.delayed,
       coalesce(extract(epoch FROM now() - least(
           (SELECT (CASE WHEN isfinite(m.created_at) THEN least(m.created_at, now()) ELSE now() END) FROM "outbox"."messages" m WHERE m.held_since IS NULL ORDER BY m.id LIMIT 1),
           (SELECT min((CASE WHEN isfinite(c.created_at) THEN least(c.created_at, now()) ELSE now() END)) FROM "outbox"."deliveries" c WHERE c.held_since IS NULL))), 0)::float8,
       (SELECT count(*) FROM "outbox"."dead_letters")
FROM p, w
