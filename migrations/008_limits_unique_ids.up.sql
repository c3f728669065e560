-- Version 8: limits that keep every row settleable, and unique message ids.
-- relay-min: 7 (relays of version 7 run unchanged on it: it only adds
-- constraints on new rows and indexes they do not read)
--
-- Topic, key and dedup key are bounded at insert time. Longer values used
-- to be accepted and then break the relay later: a dead letter or a retry
-- needs an index entry holding the topic or key, and Postgres refuses
-- entries over ~2.7 kB, so such a row could never be settled. The limits
-- are NOT VALID: every new row is checked, existing rows are not scanned
-- (the relay settles an over-long old row on its own, see
-- relay/settle.go). The constraint names carry the limit, so the error a
-- writer gets says what it is.
ALTER TABLE {{.Schema}}.messages ADD CONSTRAINT messages_topic_length
    CHECK (octet_length(topic) <= 249) NOT VALID;
ALTER TABLE {{.Schema}}.messages ADD CONSTRAINT messages_key_length
    CHECK (octet_length(key) <= 1024) NOT VALID;
ALTER TABLE {{.Schema}}.messages ADD CONSTRAINT messages_dedup_key_length
    CHECK (octet_length(dedup_key) <= 1024) NOT VALID;

-- A dead letter must always be storable, whatever the topic of an old row:
-- a hash index has no entry-size limit and serves `topic = …` lookups.
DROP INDEX {{.Schema}}.dead_letters_topic_idx;
CREATE INDEX dead_letters_topic_idx ON {{.Schema}}.dead_letters USING hash (topic);

-- message_id is what consumers deduplicate on, so two pending messages
-- must never share one (a caller may set it). Delivered messages leave
-- the table, so an id may be reused once its message is delivered; the
-- writer generates time-ordered ids, which keep this index append-mostly.
DO $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM (
        SELECT message_id FROM {{.Schema}}.messages GROUP BY message_id HAVING count(*) > 1) d;
    IF n > 0 THEN
        RAISE EXCEPTION 'outbox: % message ids are shared by several pending messages; give them new ids or wait until they are delivered, then migrate again', n
            USING ERRCODE = 'unique_violation',
                  HINT = 'SELECT message_id, array_agg(id) FROM <schema>.messages GROUP BY 1 HAVING count(*) > 1';
    END IF;
END
$$;
CREATE UNIQUE INDEX messages_message_id_idx ON {{.Schema}}.messages (message_id);
