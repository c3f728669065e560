SELECT NOT EXISTS (SELECT 1 FROM "outbox"."messages") AND NOT EXISTS (SELECT 1 FROM "outbox"."deliveries")
