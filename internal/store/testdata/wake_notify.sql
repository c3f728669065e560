SELECT pg_notify(@channel, @payload)
