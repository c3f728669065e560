-- Version 3: routes. A relay configured with several routes (topic
-- patterns, each with its own sink) runs one consumer per route; each
-- route leases its own set of the 256 lanes, so one route's slow or
-- failing sink never holds the lanes of another. The route '' is the
-- single, catch-all route of a relay without a routes table.
ALTER TABLE {{.Schema}}.lanes ADD COLUMN route text NOT NULL DEFAULT '';
ALTER TABLE {{.Schema}}.lanes DROP CONSTRAINT lanes_pkey;
ALTER TABLE {{.Schema}}.lanes ADD PRIMARY KEY (route, lane);
ALTER TABLE {{.Schema}}.relays ADD COLUMN route text NOT NULL DEFAULT '';
