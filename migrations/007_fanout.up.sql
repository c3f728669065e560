-- Version 7: fan-out. A message whose topic several routes take (a route
-- marked fanout: true receives a copy of what its topics match, besides
-- the route that takes the message first) is copied by the relays' fan-out
-- router, in the transaction that removes it from the outbox, into one
-- delivery row per destination route. Each destination claims, retries and
-- dead-letters its copy independently; the copy keeps the message's id
-- (write order), message_id (what consumers deduplicate on) and lane (key
-- order). Routes that share no topic with a fan-out route never touch this
-- table: the plain path is unchanged.
CREATE TABLE {{.Schema}}.deliveries (
    route           text        NOT NULL,
    id              bigint      NOT NULL,
    message_id      uuid        NOT NULL,
    topic           text        NOT NULL,
    key             text,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL,
    lane            smallint    NOT NULL,
    created_at      timestamptz NOT NULL,
    available_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    first_error     text,
    last_error      text,
    first_failed_at timestamptz,
    dedup_key       text,
    priority        smallint    NOT NULL DEFAULT 0,
    PRIMARY KEY (route, id)
);
-- The same access paths as the outbox's, per route.
CREATE INDEX deliveries_lane_id_idx ON {{.Schema}}.deliveries (route, lane, id);
CREATE INDEX deliveries_waiting_key_idx ON {{.Schema}}.deliveries (route, key, id)
    WHERE available_at IS NOT NULL;
CREATE INDEX deliveries_priority_idx ON {{.Schema}}.deliveries (route, lane, priority DESC, key)
    WHERE priority > 0;
ALTER TABLE {{.Schema}}.deliveries ALTER COLUMN lane SET (n_distinct = 256);
CREATE TRIGGER deliveries_notify AFTER INSERT ON {{.Schema}}.deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.notify_relay();

-- The lane of a key, as the messages table computes it (for copies made
-- outside the router: replays to one destination).
CREATE FUNCTION {{.Schema}}.lane_of(key text, id bigint) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN key IS NULL THEN (id % 256)::smallint
                ELSE get_byte(decode(md5(key), 'hex'), 0)::smallint END
$$;

-- A dead letter of a fan-out copy names its destination route, and one
-- message may be dead in several. '' is a message dead-lettered from the
-- outbox itself (replay puts it back there, to be routed again).
ALTER TABLE {{.Schema}}.dead_letters ADD COLUMN route text NOT NULL DEFAULT '';
ALTER TABLE {{.Schema}}.dead_letters DROP CONSTRAINT dead_letters_pkey;
ALTER TABLE {{.Schema}}.dead_letters ADD PRIMARY KEY (id, route);
ALTER TABLE {{.Schema}}.archive ADD COLUMN route text NOT NULL DEFAULT '';
