WITH d AS (
    DELETE FROM "outbox"."deliveries" m WHERE m.ctid = ANY(@ctids::tid[])
    RETURNING id, message_id, topic, key, payload, headers, created_at
)
INSERT INTO "outbox"."archive" (id, message_id, topic, key, payload, headers, created_at, delivered_at, route)
SELECT id, message_id, topic, key, payload, headers, created_at, now(), @route::text FROM d
