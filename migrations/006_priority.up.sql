-- Version 6: priority across keys. A message with priority > 0 is claimed
-- before the backlog of other keys (higher first); it never overtakes an
-- earlier message of its own key. 0, the default, is the plain path:
-- adding the column with a constant default rewrites nothing, and rows
-- with priority 0 never enter the partial index below.
ALTER TABLE {{.Schema}}.messages ADD COLUMN priority smallint NOT NULL DEFAULT 0;
-- NOT VALID: enforced for every new row, without a scan of the existing
-- ones (all 0) under the exclusive lock this migration holds.
ALTER TABLE {{.Schema}}.messages ADD CONSTRAINT messages_priority_range CHECK (priority >= 0) NOT VALID;
-- Which lanes hold priority messages, and of which keys: probed by every
-- claim, so it must stay empty (and free) when nobody uses priorities.
CREATE INDEX messages_priority_idx ON {{.Schema}}.messages (lane, priority DESC, key)
    WHERE priority > 0;
ALTER TABLE {{.Schema}}.dead_letters ADD COLUMN priority smallint NOT NULL DEFAULT 0;

-- enqueue gains an optional priority argument.
DROP FUNCTION {{.Schema}}.enqueue(text, text, jsonb, jsonb, timestamptz, text);
DROP FUNCTION {{.Schema}}.enqueue(text, text, text, jsonb, timestamptz, text);
DROP FUNCTION {{.Schema}}.enqueue(text, text, bytea, jsonb, timestamptz, text);

CREATE FUNCTION {{.Schema}}.enqueue(topic text, key text, payload bytea, headers jsonb DEFAULT '{}',
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL,
                                    priority integer DEFAULT 0)
RETURNS uuid LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    id uuid;
BEGIN
    INSERT INTO {{.Schema}}.messages AS m (topic, key, payload, headers, available_at, dedup_key, priority)
    VALUES (enqueue.topic, enqueue.key, enqueue.payload, coalesce(enqueue.headers, '{}'),
            CASE WHEN enqueue.deliver_at > now() THEN enqueue.deliver_at END, enqueue.dedup_key,
            coalesce(enqueue.priority, 0))
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
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL,
                                    priority integer DEFAULT 0)
RETURNS uuid LANGUAGE sql AS $$
    SELECT {{.Schema}}.enqueue(topic, key, convert_to(payload::text, 'UTF8'), headers, deliver_at, dedup_key, priority)
$$;
CREATE FUNCTION {{.Schema}}.enqueue(topic text, key text, payload text, headers jsonb DEFAULT '{}',
                                    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL,
                                    priority integer DEFAULT 0)
RETURNS uuid LANGUAGE sql AS $$
    SELECT {{.Schema}}.enqueue(topic, key, convert_to(payload, 'UTF8'), headers, deliver_at, dedup_key, priority)
$$;
