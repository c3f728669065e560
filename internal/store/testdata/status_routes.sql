SELECT coalesce(p.route, d.route), coalesce(p.n, 0), coalesce(p.ready, 0), coalesce(p.retrying, 0), coalesce(p.delayed, 0),
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, coalesce(d.n, 0)
FROM (SELECT c.route, count(*) FILTER (WHERE NOT (c.held_since IS NOT NULL)) n, count(*) FILTER (WHERE ((c.available_at IS NULL OR c.available_at <= now()) AND NOT (c.available_at IS NOT NULL AND c.attempts > 0 AND c.held_since IS NULL))) ready,
       count(*) FILTER (WHERE (c.available_at IS NOT NULL AND c.attempts > 0 AND c.held_since IS NULL)) retrying, count(*) FILTER (WHERE (c.attempts = 0 AND (c.available_at IS NOT NULL AND c.available_at > now()) AND c.held_since IS NULL)) delayed,
       min((CASE WHEN isfinite(c.created_at) THEN least(c.created_at, now()) ELSE now() END)) FILTER (WHERE NOT (c.held_since IS NOT NULL)) oldest
      FROM "outbox"."deliveries" c GROUP BY c.route) p
FULL JOIN (SELECT route, count(*) n FROM "outbox"."dead_letters" WHERE route <> '' GROUP BY route) d ON d.route = p.route
ORDER BY 1
