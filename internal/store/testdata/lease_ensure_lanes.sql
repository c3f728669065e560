INSERT INTO "outbox"."lanes" (route, lane) SELECT @route, g FROM generate_series(0, 255) AS g ON CONFLICT DO NOTHING
