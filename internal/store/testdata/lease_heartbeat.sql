INSERT INTO "outbox"."relays" (id, hostname, pid, version, route, in_flight, backend_pid, backend_start, config_hash, config_summary,
    down_since, down_cause, down_probes, limited_since, limited_cause, failing_since, last_error)
SELECT @relay, @hostname, @pid, @version, @route, @in_flight,
       CASE WHEN @pooled::bool THEN 0 ELSE pg_backend_pid() END,
       CASE WHEN @pooled::bool THEN NULL ELSE a.backend_start END,
       @config_hash, @config_summary,
       now() - @down_for::bigint * interval '1 microsecond', @down_cause::text, @down_probes::int,
       now() - @limited_for::bigint * interval '1 microsecond', @limited_cause::text,
       now() - @failing_for::bigint * interval '1 microsecond', @last_error::text
FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), in_flight = EXCLUDED.in_flight,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
    down_since = EXCLUDED.down_since, down_cause = EXCLUDED.down_cause, down_probes = EXCLUDED.down_probes,
    limited_since = EXCLUDED.limited_since, limited_cause = EXCLUDED.limited_cause,
    failing_since = EXCLUDED.failing_since, last_error = EXCLUDED.last_error
