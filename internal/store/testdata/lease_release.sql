UPDATE "outbox"."lanes" SET owner = NULL, lease_until = NULL
WHERE lane IN (
    SELECT l.lane FROM "outbox"."lanes" l WHERE l.route = @route AND l.owner = @relay AND l.lane = ANY(@lanes::int2[])
    FOR UPDATE SKIP LOCKED)
  AND route = @route
RETURNING lane
