SELECT coalesce(max(id), 0) FROM "outbox"."messages"
