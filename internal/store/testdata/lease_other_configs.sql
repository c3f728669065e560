SELECT r.id, r.version, r.config_hash, r.config_summary,
       (r.started_at, r.id) < (coalesce((SELECT m.started_at FROM "outbox"."relays" m WHERE m.id = @relay), 'infinity'), @relay)
FROM "outbox"."relays" r
WHERE r.route = @route AND r.id <> @relay AND r.config_hash <> @config_hash
  AND r.heartbeat_at > now() - @ttl_ms * interval '1 millisecond' AND NOT (@fast_failover AND r.backend_pid <> 0 AND NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
            WHERE a.pid = r.backend_pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start)))
ORDER BY r.started_at, r.id
LIMIT @max
