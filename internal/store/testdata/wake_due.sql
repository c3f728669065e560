WITH t AS MATERIALIZED (SELECT timestamptz 'epoch' + @since * interval '1 microsecond' AS since)
SELECT now(), (extract(epoch FROM now()) * 1000000)::bigint,
       coalesce((SELECT array_agg(DISTINCT d.lane) FROM (
           (SELECT m.lane FROM "outbox"."messages" m, t WHERE m.available_at > t.since AND m.available_at <= now() LIMIT 10000)
           UNION ALL
           (SELECT c.lane FROM "outbox"."deliveries" c, t WHERE c.available_at > t.since AND c.available_at <= now() LIMIT 10000)) d), '{}'),
       least((SELECT min(m.available_at) FROM "outbox"."messages" m WHERE m.available_at > now() AND m.available_at < 'infinity'),
             (SELECT min(c.available_at) FROM "outbox"."deliveries" c WHERE c.available_at > now() AND c.available_at < 'infinity')),
       (SELECT q.last_value FROM pg_sequences q
        WHERE format('%I.%I', q.schemaname, q.sequencename) = pg_get_serial_sequence(@table, 'id'))
