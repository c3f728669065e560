INSERT INTO "outbox"."relays" (id, hostname, pid, version, route, in_flight, backend_pid, backend_start)
SELECT @relay, @hostname, @pid, @version, @route, @in_flight, pg_backend_pid(), a.backend_start
FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), in_flight = EXCLUDED.in_flight,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start
