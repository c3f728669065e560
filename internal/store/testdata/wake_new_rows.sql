WITH n AS MATERIALIZED (
    SELECT m.id, m.lane FROM "outbox"."messages" m WHERE m.id > @seen ORDER BY m.id LIMIT 10000
), g AS MATERIALIZED (
    SELECT m.id, m.lane FROM "outbox"."messages" m WHERE m.id = ANY(@gaps::bigint[]) AND cardinality(@gaps::bigint[]) > 0
)
SELECT coalesce((SELECT max(id) FROM n), @seen),
       coalesce((SELECT array_agg(id ORDER BY id) FROM n WHERE id > (SELECT max(id) FROM n) - @span), '{}'),
       coalesce((SELECT array_agg(DISTINCT lane) FROM (SELECT lane FROM n UNION ALL SELECT lane FROM g) l), '{}'),
       coalesce((SELECT array_agg(id) FROM g), '{}')
