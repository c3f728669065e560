SELECT pg_try_advisory_lock_shared(@key, hashtext(@schema)), pg_notify(@channel, 'listener')
