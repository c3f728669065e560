INSERT INTO "outbox"."deliveries"
    (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
SELECT d.route, m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at, m.dedup_key, m.priority
FROM (SELECT * FROM "outbox"."messages" WHERE ctid = ANY(@ctids::tid[])) m
JOIN unnest(@ids::bigint[], @routes::text[]) AS d(id, route) ON d.id = m.id
