SELECT topic, reason, count(*) FROM "outbox"."dead_letters" GROUP BY 1, 2 ORDER BY 1, 2
