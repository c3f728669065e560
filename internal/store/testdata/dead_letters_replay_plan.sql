SELECT id, route, message_id, dedup_key, outcome, key_holder, run_holder, id_pending, busy FROM (
    SELECT r.id, r.route, r.message_id, r.dedup_key,
           CASE WHEN r.id_pending THEN 'skipped'
                WHEN r.key_holder IS NOT NULL OR r.run_holder IS NOT NULL THEN
                    CASE WHEN @clear_keys THEN 'replayed_without_dedup_key' ELSE 'skipped' END
                ELSE 'replayed' END AS outcome,
           r.key_holder, r.run_holder, r.id_pending, false AS busy
    FROM (
        SELECT d.id, d.route, d.message_id::text AS message_id, d.dedup_key,
               CASE WHEN d.route = '' THEN
                   (SELECT m.message_id::text FROM "outbox"."messages" m WHERE m.dedup_key = d.dedup_key AND m.id <> d.id) END AS key_holder,
               CASE WHEN d.route = '' THEN
                   (SELECT min(x.id) FROM "outbox"."dead_letters" x WHERE x.route = '' AND x.dedup_key = d.dedup_key AND x.id < d.id
                      AND (x.id, x.route) IN (SELECT id, route FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route))) END AS run_holder,
               CASE WHEN d.route = '' THEN EXISTS (SELECT 1 FROM "outbox"."messages" m WHERE m.id = d.id AND NOT (m.held_since IS NOT NULL))
                    ELSE EXISTS (SELECT 1 FROM "outbox"."deliveries" c WHERE c.route = d.route AND c.id = d.id AND NOT (c.held_since IS NOT NULL)) END AS id_pending
        FROM "outbox"."dead_letters" d WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
    ) r
) r
ORDER BY id, route
