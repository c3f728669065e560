WITH pick AS MATERIALIZED (
    SELECT l.lane FROM "outbox"."lanes" l
    WHERE l.route = @route AND (l.owner IS NULL OR l.lease_until < now()
       OR NOT EXISTS (SELECT 1 FROM "outbox"."relays" r WHERE r.id = l.owner))
    ORDER BY l.lane
    LIMIT @n
    FOR UPDATE SKIP LOCKED)
UPDATE "outbox"."lanes" t SET owner = @relay, lease_until = now() + @ttl_ms * interval '1 millisecond'
FROM pick
WHERE t.route = @route AND t.lane = pick.lane
RETURNING t.lane
