SELECT id, message_id::text, topic, key, payload, headers, created_at, attempts, reason, route, first_error, last_error, first_failed_at, dead_at, CASE WHEN x.route = '' THEN EXISTS (SELECT 1 FROM "outbox"."messages" h WHERE h.id = x.id AND (h.held_since IS NOT NULL))
    ELSE EXISTS (SELECT 1 FROM "outbox"."deliveries" h WHERE h.route = x.route AND h.id = x.id AND (h.held_since IS NOT NULL)) END AS holds,
    CASE WHEN x.key IS NULL THEN 0
         WHEN x.route = '' THEN (SELECT count(*) FROM "outbox"."messages" w
             WHERE w.lane = "outbox".lane_of(x.key, x.id) AND w.key = x.key AND w.id > x.id AND NOT (w.held_since IS NOT NULL))
         ELSE (SELECT count(*) FROM "outbox"."deliveries" w
             WHERE w.route = x.route AND w.lane = "outbox".lane_of(x.key, x.id) AND w.key = x.key AND w.id > x.id AND NOT (w.held_since IS NOT NULL))
    END AS behind FROM (
    SELECT * FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
      AND (id, route) > (@after_id, @after_route)
    ORDER BY id, route LIMIT @limit
) x
ORDER BY id, route
