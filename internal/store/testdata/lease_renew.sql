UPDATE "outbox"."lanes" SET lease_until = now() + @ttl_ms * interval '1 millisecond' WHERE route = @route AND owner = @relay RETURNING lane
