SELECT id, message_id::text, topic, key, payload, headers, created_at, attempts, reason, route, first_error, last_error, first_failed_at, dead_at FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
  AND (id, route) > (@after_id, @after_route)
ORDER BY id, route LIMIT @limit
