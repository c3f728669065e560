SELECT h.route, count(DISTINCT h.key), coalesce(extract(epoch FROM now() - min((CASE WHEN isfinite(h.held_since) THEN least(h.held_since, now()) ELSE now() END))), 0)::float8
FROM (SELECT coalesce(held_route, '') AS route, id, key, lane, held_since, 'm' AS src FROM "outbox"."messages"
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL
          UNION ALL SELECT route, id, key, lane, held_since, 'c' FROM "outbox"."deliveries"
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL) h
GROUP BY h.route ORDER BY h.route
