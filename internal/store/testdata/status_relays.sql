SELECT r.id, r.hostname, r.pid, r.version, least(r.started_at, now()), least(r.heartbeat_at, now()), r.route,
       (SELECT count(*) FROM "outbox"."lanes" l WHERE l.owner = r.id AND l.lease_until > now())::int, r.in_flight,
       r.config_hash, r.config_summary
FROM "outbox"."relays" r ORDER BY r.route, r.id
