SELECT r.id, r.version, r.config_hash, r.config_summary,
       (r.started_at, r.id) < (coalesce((SELECT m.started_at FROM "outbox"."relays" m WHERE m.id = @relay), 'infinity'), @relay)
FROM "outbox"."relays" r
WHERE r.route = @route AND r.id <> @relay AND r.config_hash <> @config_hash
  AND r.heartbeat_at > now() - @ttl_ms * interval '1 millisecond'
ORDER BY r.started_at, r.id
LIMIT @max
