SELECT NOT EXISTS (SELECT 1 FROM "outbox"."messages" WHERE held_since IS NULL)
   AND NOT EXISTS (SELECT 1 FROM "outbox"."deliveries" WHERE held_since IS NULL)
