SELECT coalesce(p.topic, d.topic), coalesce(p.n, 0), coalesce(p.ready, 0), coalesce(p.retrying, 0), coalesce(p.delayed, 0),
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, coalesce(d.n, 0)
FROM (SELECT u.topic, count(*) FILTER (WHERE NOT (u.held_since IS NOT NULL)) n, count(*) FILTER (WHERE ((u.available_at IS NULL OR u.available_at <= now()) AND NOT (u.available_at IS NOT NULL AND u.attempts > 0 AND u.held_since IS NULL))) ready,
       count(*) FILTER (WHERE (u.available_at IS NOT NULL AND u.attempts > 0 AND u.held_since IS NULL)) retrying, count(*) FILTER (WHERE (u.attempts = 0 AND (u.available_at IS NOT NULL AND u.available_at > now()) AND u.held_since IS NULL)) delayed,
       min((CASE WHEN isfinite(u.created_at) THEN least(u.created_at, now()) ELSE now() END)) FILTER (WHERE NOT (u.held_since IS NOT NULL)) oldest
      FROM (SELECT topic, attempts, available_at, created_at, held_since FROM "outbox"."messages"
            UNION ALL SELECT topic, attempts, available_at, created_at, held_since FROM "outbox"."deliveries") u
      GROUP BY u.topic) p
FULL JOIN (SELECT topic, count(*) n FROM "outbox"."dead_letters" GROUP BY topic) d ON d.topic = p.topic
ORDER BY 1
