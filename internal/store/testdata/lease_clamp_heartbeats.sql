UPDATE "outbox"."relays" SET heartbeat_at = now()
WHERE id IN (
    SELECT id FROM "outbox"."relays" WHERE id <> @relay AND heartbeat_at > clock_timestamp()
    FOR UPDATE SKIP LOCKED)
