-- outbox-relay: role for operators' commands: `outbox-relay status`,
-- `dlq list|show|replay|purge` and `replay` (from the archive).
--
-- Optional. This file is NOT an embedded migration: `outbox-relay migrate`
-- never runs it. Apply it yourself, as the owner of the outbox schema,
-- after `outbox-relay migrate`, to a role that already exists:
--
--   CREATE ROLE outbox_operator LOGIN PASSWORD '...';
--   sed -e 's/{{.Schema}}/"outbox"/g' -e 's/{{.Role}}/"outbox_operator"/g' operator.sql | psql "$DATABASE_URL"
--
-- {{.Schema}} and {{.Role}} are quoted identifiers (write them with double
-- quotes, as above).
--
-- The role reads everything, moves dead letters back into the outbox
-- (replay: DELETE from dead_letters, INSERT into messages under the
-- original id, or into deliveries for a dead fan-out copy, or un-park a
-- held one in place), replays the
-- archive (to the outbox, or to one fan-out destination) and purges dead
-- letters. It cannot settle or claim messages.

GRANT USAGE ON SCHEMA {{.Schema}} TO {{.Role}};
GRANT SELECT ON ALL TABLES IN SCHEMA {{.Schema}} TO {{.Role}};
-- UPDATE only because replay locks the rows it moves (SELECT ... FOR UPDATE
-- SKIP LOCKED), which Postgres allows only with UPDATE privilege.
GRANT SELECT, UPDATE, DELETE ON {{.Schema}}.dead_letters TO {{.Role}};
GRANT INSERT ON {{.Schema}}.messages TO {{.Role}};
GRANT INSERT ON {{.Schema}}.deliveries TO {{.Role}};
-- Replay of a dead letter that holds its key (on-dead-letter hold): its
-- row is still in the table, parked, and goes back in place. Purge
-- releases such a key through a trigger that runs as the schema owner.
GRANT UPDATE (available_at, held_since, held_route, attempts, first_error, last_error, first_failed_at)
    ON {{.Schema}}.messages TO {{.Role}};
GRANT UPDATE (available_at, held_since, attempts, first_error, last_error, first_failed_at)
    ON {{.Schema}}.deliveries TO {{.Role}};
GRANT USAGE ON SEQUENCE {{.Schema}}.messages_id_seq TO {{.Role}};
