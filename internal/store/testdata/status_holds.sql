SELECT h.route, h.key, h.id, (CASE WHEN isfinite(h.held_since) THEN least(h.held_since, now()) ELSE now() END),
       CASE WHEN h.src = 'm' THEN (SELECT count(*) FROM "outbox"."messages" w
                WHERE w.lane = h.lane AND w.key = h.key AND w.id > h.id AND NOT (w.held_since IS NOT NULL))
            ELSE (SELECT count(*) FROM "outbox"."deliveries" w
                WHERE w.route = h.route AND w.lane = h.lane AND w.key = h.key AND w.id > h.id AND NOT (w.held_since IS NOT NULL))
       END
FROM (
    SELECT DISTINCT ON (p.route, p.key) p.* FROM (SELECT coalesce(held_route, '') AS route, id, key, lane, held_since, 'm' AS src FROM "outbox"."messages"
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL
          UNION ALL SELECT route, id, key, lane, held_since, 'c' FROM "outbox"."deliveries"
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL) p
    ORDER BY p.route, p.key, p.id
) h
ORDER BY h.held_since, h.route, h.key
LIMIT @limit
