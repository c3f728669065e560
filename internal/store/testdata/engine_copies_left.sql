SELECT EXISTS (SELECT 1 FROM "outbox"."deliveries" WHERE route = @route)
