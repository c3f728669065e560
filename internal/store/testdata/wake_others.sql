SELECT EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
             AND l.classid = @key::oid AND l.objid = hashtext(@schema)::oid
             AND l.pid <> pg_backend_pid())
       OR EXISTS (SELECT 1 FROM "outbox"."relays" r WHERE r.hostname <> @hostname OR r.pid <> @pid)
