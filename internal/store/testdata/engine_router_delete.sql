DELETE FROM "outbox"."messages" WHERE ctid = ANY(@ctids::tid[])
