SELECT pg_try_advisory_lock(@key, hashtext(@schema))
