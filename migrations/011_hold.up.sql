-- Version 11: the hold policy (route setting on_dead_letter: hold). When a
-- route that holds dead-letters a message with a key, the message's row
-- stays in the outbox (or in the route's fan-out copies), parked: its
-- available_at is 'infinity', so the claim's existing check for an
-- earlier waiting message of the key (messages_waiting_key_idx) holds the
-- key's later messages back, and the plain claim is unchanged. Its dead
-- letter is written as usual. Replaying the dead letter un-parks the row
-- (same id, so it goes first, then the rest of the key); purging it
-- deletes the row and releases the key.
-- relay-min: 9 (a relay of version 9 sees a parked row as a message
-- waiting for a retry: it never claims it and holds its key too; its
-- `dlq replay` skips such a dead letter as pending, and its `dlq purge`
-- releases the key through the trigger below)
--
-- held_since: when the row was parked (NULL for every other row).
-- held_route: the route that parked it (outbox rows belong to no route
-- until one claims them; copies have their route already). Nullable
-- columns without a default: adding them rewrites nothing.
ALTER TABLE {{.Schema}}.messages ADD COLUMN held_since timestamptz;
ALTER TABLE {{.Schema}}.messages ADD COLUMN held_route text;
ALTER TABLE {{.Schema}}.deliveries ADD COLUMN held_since timestamptz;

-- A dead letter deleted by any means (dlq purge of any relay version, or
-- by hand) releases the key it held: its parked row goes with it. One
-- statement per purge, whatever its size. SECURITY DEFINER: a role that
-- may delete dead letters (roles/operator.sql) releases their holds
-- without the right to delete messages.
CREATE FUNCTION {{.Schema}}.release_holds() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM {{.Schema}}.messages m USING gone g
    WHERE g.route = '' AND m.id = g.id AND m.held_since IS NOT NULL;
    DELETE FROM {{.Schema}}.deliveries c USING gone g
    WHERE g.route <> '' AND c.route = g.route AND c.id = g.id AND c.held_since IS NOT NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER dead_letters_release_holds AFTER DELETE ON {{.Schema}}.dead_letters
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.release_holds();
