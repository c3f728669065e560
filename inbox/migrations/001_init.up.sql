-- The inbox: one row per message processed (its id, key and position), and
-- one row per key holding the key's high-water mark (the highest position
-- processed). Both are written by one statement per message, in the
-- consumer's own transaction.
CREATE TABLE {{.Schema}}.inbox_messages (
    message_id   uuid        PRIMARY KEY,
    key          text        NOT NULL DEFAULT '',
    seq          bigint      NOT NULL DEFAULT 0,
    processed_at timestamptz NOT NULL DEFAULT now()
);
-- Rows arrive in processed_at order, so a BRIN index serves Prune's
-- "older than" scan for a few pages, and costs an insert next to nothing.
CREATE INDEX inbox_messages_processed_at ON {{.Schema}}.inbox_messages USING brin (processed_at);

CREATE TABLE {{.Schema}}.inbox_keys (
    key  text   PRIMARY KEY,
    -- mark is the highest position processed for the key.
    mark bigint NOT NULL,
    -- prev is the mark before the last statement that touched the row: the
    -- statement returns it, because RETURNING sees only the new row.
    prev bigint NOT NULL DEFAULT 0
);
