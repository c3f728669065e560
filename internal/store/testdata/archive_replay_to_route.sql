INSERT INTO "outbox"."deliveries" (route, id, message_id, topic, key, payload, headers, lane, created_at)
SELECT @route, p.new_id, CASE WHEN @new_ids THEN gen_random_uuid() ELSE p.message_id END, p.topic, p.key, p.payload, p.headers,
       "outbox".lane_of(p.key, p.new_id), now()
FROM (SELECT o.*, nextval(pg_get_serial_sequence(format('%I.messages', @schema::text), 'id')) AS new_id
      FROM (SELECT DISTINCT ON (id) id, message_id, topic, key, payload, headers, created_at FROM "outbox"."archive"
WHERE (@from::timestamptz IS NULL OR (created_at >= @from AND delivered_at >= @from))
  AND (@to::timestamptz IS NULL OR created_at < @to) AND (@topic::text IS NULL OR topic = @topic)
  AND (@from_ms::bigint IS NULL OR (created_at >= now() - @from_ms * interval '1 millisecond'
                                    AND delivered_at >= now() - @from_ms * interval '1 millisecond'))
  AND (@to_ms::bigint IS NULL OR created_at < now() - @to_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
ORDER BY id) o) p
ORDER BY p.new_id
