WITH gone AS (
    DELETE FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
    RETURNING id, route
)
SELECT count(*), count(*) FILTER (WHERE CASE WHEN gone.route = '' THEN EXISTS (SELECT 1 FROM "outbox"."messages" h WHERE h.id = gone.id AND (h.held_since IS NOT NULL))
    ELSE EXISTS (SELECT 1 FROM "outbox"."deliveries" h WHERE h.route = gone.route AND h.id = gone.id AND (h.held_since IS NOT NULL)) END) FROM gone
