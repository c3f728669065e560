SELECT m.id, m.ctid FROM "outbox"."messages" m WHERE m.id = ANY(@ids) FOR UPDATE SKIP LOCKED
