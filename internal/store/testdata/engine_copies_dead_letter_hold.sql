WITH f AS (
    SELECT * FROM unnest(@ids::bigint[], @reasons::text[], @errors::text[]) AS f(id, reason, err)
), p AS (
    UPDATE "outbox"."deliveries" m SET available_at = 'infinity'::timestamptz, held_since = now()
    FROM f WHERE m.id = f.id AND m.route = @route AND m.key IS NOT NULL
    RETURNING m.*, f.reason, f.err
), g AS (
    DELETE FROM "outbox"."deliveries" m USING f WHERE m.id = f.id AND m.route = @route AND m.key IS NULL
    RETURNING m.*, f.reason, f.err
), d AS (
    SELECT * FROM p UNION ALL SELECT * FROM g
)
INSERT INTO "outbox"."dead_letters"
    (id, message_id, topic, key, payload, headers, created_at, attempts, reason,
     first_error, last_error, first_failed_at, dedup_key, priority, route)
SELECT id, message_id, topic, key, payload, headers, created_at, attempts + 1, reason,
       coalesce(first_error, err), err, coalesce(first_failed_at, now()), dedup_key, priority, @route::text
FROM d
ON CONFLICT (id, route) DO UPDATE SET
    message_id = EXCLUDED.message_id, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
    attempts = EXCLUDED.attempts, reason = EXCLUDED.reason, first_error = EXCLUDED.first_error,
    last_error = EXCLUDED.last_error, first_failed_at = EXCLUDED.first_failed_at,
    dedup_key = EXCLUDED.dedup_key, priority = EXCLUDED.priority, dead_at = now()
