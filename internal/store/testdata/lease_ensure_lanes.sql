INSERT INTO "outbox"."lanes" (route, lane) SELECT @route, g FROM generate_series(0, 255) AS g
WHERE (SELECT count(*) FROM "outbox"."lanes" WHERE route = @route) < 256
ON CONFLICT DO NOTHING
