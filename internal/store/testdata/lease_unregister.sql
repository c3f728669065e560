DELETE FROM "outbox"."relays" WHERE id = @relay
