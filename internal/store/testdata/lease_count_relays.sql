SELECT count(*), count(*) FILTER (WHERE id < @relay),
    (SELECT count(*) FROM "outbox"."lanes" WHERE route = @route)
FROM "outbox"."relays" WHERE route = @route
