DELETE FROM "outbox"."deliveries" WHERE ctid = ANY(@ctids::tid[])
