SELECT m.id, m.ctid FROM "outbox"."deliveries" m WHERE m.id = ANY(@ids) AND m.route = @route FOR UPDATE SKIP LOCKED
