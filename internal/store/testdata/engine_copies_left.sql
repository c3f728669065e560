SELECT EXISTS (SELECT 1 FROM "outbox"."deliveries" c WHERE c.route = @route AND c.held_since IS NULL
    AND NOT EXISTS (SELECT 1 FROM "outbox"."deliveries" h
                    WHERE h.route = c.route AND h.key = c.key AND h.id < c.id AND (h.held_since IS NOT NULL)))
