SELECT count(*) FROM (SELECT DISTINCT ON (id) id, message_id, topic, key, payload, headers, created_at FROM "outbox"."archive"
WHERE (@from::timestamptz IS NULL OR (created_at >= @from AND delivered_at >= @from))
  AND (@to::timestamptz IS NULL OR created_at < @to) AND (@topic::text IS NULL OR topic = @topic)
  AND (@from_ms::bigint IS NULL OR (created_at >= now() - @from_ms * interval '1 millisecond'
                                    AND delivered_at >= now() - @from_ms * interval '1 millisecond'))
  AND (@to_ms::bigint IS NULL OR created_at < now() - @to_ms * interval '1 millisecond')
  AND (@route::text IS NULL OR route = @route)
ORDER BY id) p WHERE @new_ids::bool IS NOT NULL
