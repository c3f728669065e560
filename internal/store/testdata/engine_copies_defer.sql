UPDATE "outbox"."deliveries" m SET
    available_at = clock_timestamp() + f.delay_ms * interval '1 millisecond',
    last_error = f.err
FROM unnest(@ids::bigint[], @delay_ms::bigint[], @errors::text[]) AS f(id, delay_ms, err)
WHERE m.id = f.id AND m.route = @route
