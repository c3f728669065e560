-- Version 2: idempotent enqueue (dedup_key), delayed delivery (writers may
-- set available_at), and the optional archive of delivered messages.

-- A message whose dedup_key equals that of a pending message is not
-- written again (the writer gets the existing message id back). The key
-- is free again once the message is delivered or dead-lettered.
ALTER TABLE {{.Schema}}.messages ADD COLUMN dedup_key text;
CREATE UNIQUE INDEX messages_dedup_key_idx ON {{.Schema}}.messages (dedup_key)
    WHERE dedup_key IS NOT NULL;
ALTER TABLE {{.Schema}}.dead_letters ADD COLUMN dedup_key text;

-- Delivered messages, kept only when the relay runs with --archive, for
-- replays (event-sourcing consumers rebuilding state). Partitioned by
-- delivery day so that retention drops whole partitions instead of
-- deleting rows; the relay creates and drops the partitions.
CREATE TABLE {{.Schema}}.archive (
    id           bigint      NOT NULL,
    message_id   uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL,
    delivered_at timestamptz NOT NULL
) PARTITION BY RANGE (delivered_at);
CREATE INDEX archive_topic_delivered_idx ON {{.Schema}}.archive (topic, delivered_at);

-- enqueue gains optional deliver_at and dedup_key arguments. The old
-- signatures are replaced (same leading arguments, same defaults).
DROP FUNCTION {{.Schema}}.enqueue(text, text, jsonb, jsonb);
DROP FUNCTION {{.Schema}}.enqueue(text, text, text, jsonb);
DROP FUNCTION {{.Schema}}.enqueue(text, text, bytea, jsonb);

CREATE FUNCTION {{.Schema}}.enqueue(topic text, key text, payload bytea, headers jsonb DEFAULT '{}',
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    id uuid;
BEGIN
    INSERT INTO {{.Schema}}.messages AS m (topic, key, payload, headers, available_at, dedup_key)
    VALUES (enqueue.topic, enqueue.key, enqueue.payload, coalesce(enqueue.headers, '{}'),
            CASE WHEN enqueue.deliver_at > now() THEN enqueue.deliver_at END, enqueue.dedup_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING m.message_id INTO id;
    IF id IS NULL THEN
        -- A pending message already has this dedup key: report it.
        SELECT m.message_id INTO id FROM {{.Schema}}.messages m WHERE m.dedup_key = enqueue.dedup_key;
    END IF;
    RETURN id;
END
$$;
CREATE FUNCTION {{.Schema}}.enqueue(topic text, key text, payload jsonb, headers jsonb DEFAULT '{}',
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    SELECT {{.Schema}}.enqueue(topic, key, convert_to(payload::text, 'UTF8'), headers, deliver_at, dedup_key)
$$;
CREATE FUNCTION {{.Schema}}.enqueue(topic text, key text, payload text, headers jsonb DEFAULT '{}',
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    SELECT {{.Schema}}.enqueue(topic, key, convert_to(payload, 'UTF8'), headers, deliver_at, dedup_key)
$$;
