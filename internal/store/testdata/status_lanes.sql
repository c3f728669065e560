WITH routes AS (SELECT route FROM "outbox"."lanes" UNION SELECT route FROM "outbox"."relays"),
cov AS (
    SELECT rt.route,
           (SELECT count(*) FROM "outbox"."relays" r WHERE r.route = rt.route)::int AS relays,
           (SELECT count(*) FROM "outbox"."lanes" l WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255)::int AS present,
           (SELECT count(*) FROM "outbox"."lanes" l
            WHERE l.route = rt.route AND l.lane BETWEEN 0 AND 255 AND l.owner IS NOT NULL AND l.lease_until > now()
              AND EXISTS (SELECT 1 FROM "outbox"."relays" r WHERE r.id = l.owner))::int AS worked
    FROM routes rt
)
SELECT route, relays, worked, 256 - worked, 256 - present FROM cov ORDER BY 1
