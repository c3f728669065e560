ALTER TABLE "outbox"."messages" ENABLE TRIGGER messages_notify
