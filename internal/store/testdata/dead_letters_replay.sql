WITH picked AS MATERIALIZED (
    SELECT id, route FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
), sel AS MATERIALIZED (
    SELECT id, route FROM "outbox"."dead_letters" WHERE (@ids::bigint[] IS NULL OR id = ANY(@ids)) AND (@topic::text IS NULL OR topic = @topic)
  AND (@key::text IS NULL OR key = @key) AND (@reason::text IS NULL OR reason = @reason)
  AND (@dead_before::timestamptz IS NULL OR dead_at < @dead_before)
  AND (@dead_after::timestamptz IS NULL OR dead_at >= @dead_after)
  AND (@older_ms::bigint IS NULL OR dead_at < now() - @older_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route) ORDER BY id, route FOR UPDATE SKIP LOCKED
), d AS MATERIALIZED (
    SELECT dl.* FROM "outbox"."dead_letters" dl JOIN sel USING (id, route)
), unparked AS (
    UPDATE "outbox"."messages" m SET available_at = NULL, held_since = NULL, attempts = 0, first_error = NULL, last_error = NULL, first_failed_at = NULL, held_route = NULL
    FROM d WHERE d.route = '' AND m.id = d.id AND (m.held_since IS NOT NULL)
    RETURNING m.id
), unparked_copies AS (
    UPDATE "outbox"."deliveries" m SET available_at = NULL, held_since = NULL, attempts = 0, first_error = NULL, last_error = NULL, first_failed_at = NULL
    FROM d WHERE d.route <> '' AND m.route = d.route AND m.id = d.id AND (m.held_since IS NOT NULL)
    RETURNING m.route, m.id
), outbox AS (
    INSERT INTO "outbox"."messages" (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, dedup_key, priority FROM d
    WHERE route = '' AND id NOT IN (SELECT id FROM unparked) ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), cleared AS (
    INSERT INTO "outbox"."messages" (id, message_id, topic, key, payload, headers, created_at, dedup_key, priority)
    SELECT id, message_id, topic, key, payload, headers, created_at, NULL, priority FROM d
    WHERE @clear_keys AND route = '' AND dedup_key IS NOT NULL AND id NOT IN (SELECT id FROM outbox)
      AND id NOT IN (SELECT id FROM unparked) ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id
), copies AS (
    INSERT INTO "outbox"."deliveries" (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
    SELECT route, id, message_id, topic, key, payload, headers, "outbox".lane_of(key, id), created_at, dedup_key, priority FROM d
    WHERE route <> '' AND (route, id) NOT IN (SELECT route, id FROM unparked_copies) ORDER BY id
    ON CONFLICT (route, id) DO NOTHING
    RETURNING route, id
), done AS MATERIALIZED (
    SELECT id, '' AS route, 'replayed' AS outcome FROM outbox
    UNION ALL SELECT id, '', 'replayed_without_dedup_key' FROM cleared
    UNION ALL SELECT id, route, 'replayed' FROM copies
    UNION ALL SELECT id, '', 'replayed' FROM unparked
    UNION ALL SELECT id, route, 'replayed' FROM unparked_copies
), gone AS (
    DELETE FROM "outbox"."dead_letters" dl USING done WHERE dl.id = done.id AND dl.route = done.route
)
SELECT id, route, message_id, dedup_key, outcome, key_holder, run_holder, id_pending, busy FROM (
    SELECT p.id, p.route, dl.message_id::text AS message_id, dl.dedup_key,
           coalesce(done.outcome, 'skipped') AS outcome,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT m.message_id::text FROM "outbox"."messages" m WHERE m.dedup_key = dl.dedup_key AND m.id <> p.id) END AS key_holder,
           CASE WHEN p.route = '' AND done.outcome IS DISTINCT FROM 'replayed' THEN
               (SELECT min(x.id) FROM d x WHERE x.route = '' AND x.dedup_key = dl.dedup_key AND x.id < p.id
                  AND x.id IN (SELECT id FROM outbox)) END AS run_holder,
           done.id IS NULL AND CASE WHEN p.route = '' THEN EXISTS (SELECT 1 FROM "outbox"."messages" m WHERE m.id = p.id AND NOT (m.held_since IS NOT NULL))
               ELSE EXISTS (SELECT 1 FROM "outbox"."deliveries" c WHERE c.route = p.route AND c.id = p.id AND NOT (c.held_since IS NOT NULL)) END AS id_pending,
           sel.id IS NULL AS busy
    FROM picked p
    JOIN "outbox"."dead_letters" dl ON dl.id = p.id AND dl.route = p.route
    LEFT JOIN sel ON sel.id = p.id AND sel.route = p.route
    LEFT JOIN done ON done.id = p.id AND done.route = p.route
) r
ORDER BY id, route
