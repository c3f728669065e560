SELECT pg_notify(@channel, 'members')
