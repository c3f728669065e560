SELECT EXISTS (SELECT 1 FROM "outbox"."deliveries" p
    WHERE p.route = @route AND p.priority > 0 AND p.lane % @workers = @worker
      AND (p.available_at IS NULL OR p.available_at <= statement_timestamp())
      AND (@topics::text[] IS NULL OR p.topic LIKE ANY(@topics)) AND (@exclude::text[] IS NULL OR NOT p.topic LIKE ANY(@exclude)))
