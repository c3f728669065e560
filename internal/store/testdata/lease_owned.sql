SELECT lane FROM "outbox"."lanes" WHERE route = @route AND owner = @relay
