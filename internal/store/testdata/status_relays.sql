SELECT r.id, r.hostname, r.pid, r.version, least(r.started_at, now()), least(r.heartbeat_at, now()), r.route,
       (SELECT count(*) FROM "outbox"."lanes" l WHERE l.owner = r.id AND l.lease_until > now())::int, r.in_flight,
       r.config_hash, r.config_summary,
       CASE WHEN r.down_since IS NOT NULL THEN least(r.down_since, now()) END, coalesce(r.down_cause, ''), r.down_probes,
       CASE WHEN r.limited_since IS NOT NULL THEN least(r.limited_since, now()) END, coalesce(r.limited_cause, ''),
       CASE WHEN r.failing_since IS NOT NULL THEN least(r.failing_since, now()) END, coalesce(r.last_error, '')
FROM "outbox"."relays" r ORDER BY r.route, r.id
