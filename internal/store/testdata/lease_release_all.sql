UPDATE "outbox"."lanes" SET owner = NULL, lease_until = NULL WHERE route = @route AND owner = @relay
