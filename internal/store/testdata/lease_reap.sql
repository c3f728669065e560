DELETE FROM "outbox"."relays" WHERE id IN (
    SELECT r.id FROM "outbox"."relays" r
    WHERE r.id <> @relay AND (
        r.heartbeat_at < now() - @ttl_ms * interval '1 millisecond'
        OR (@fast_failover AND r.backend_pid <> 0 AND NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
            WHERE a.pid = r.backend_pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start))))
    FOR UPDATE SKIP LOCKED)
