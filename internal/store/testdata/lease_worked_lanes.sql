SELECT count(*) FROM "outbox"."lanes" l
WHERE l.route = @route AND l.owner IS NOT NULL AND l.lease_until > now()
  AND EXISTS (SELECT 1 FROM "outbox"."relays" r WHERE r.id = l.owner)
