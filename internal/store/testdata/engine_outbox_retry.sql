UPDATE "outbox"."messages" m SET
    attempts = m.attempts + 1,
    available_at = c.t + f.delay_ms * interval '1 millisecond',
    last_error = f.err,
    first_error = coalesce(m.first_error, f.err),
    first_failed_at = coalesce(m.first_failed_at, c.t)
FROM unnest(@ids::bigint[], @delay_ms::bigint[], @errors::text[]) AS f(id, delay_ms, err),
     (SELECT clock_timestamp() AS t) c
WHERE m.id = f.id
