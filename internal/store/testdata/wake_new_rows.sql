SELECT coalesce(max(n.id), @seen), coalesce(array_agg(DISTINCT n.lane), '{}')
FROM (SELECT m.id, m.lane FROM "outbox"."messages" m WHERE m.id > @seen ORDER BY m.id LIMIT 10000) n
