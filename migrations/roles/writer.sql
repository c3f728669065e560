-- outbox-relay: least-privilege role for applications that WRITE events.
--
-- Optional. This file is NOT an embedded migration: `outbox-relay migrate`
-- never runs it. Apply it yourself, as the owner of the outbox schema,
-- after `outbox-relay migrate`, to a role that already exists:
--
--   CREATE ROLE app_writer LOGIN PASSWORD '...';   -- or your IAM/role setup
--   sed -e 's/{{.Schema}}/"outbox"/g' -e 's/{{.Role}}/"app_writer"/g' writer.sql | psql "$DATABASE_URL"
--
-- {{.Schema}} and {{.Role}} are quoted identifiers (write them with double
-- quotes, as above), exactly like the migrations' {{.Schema}}.
--
-- What the role can do: insert messages (the Go writer, database/sql, plain
-- INSERT or enqueue(), with dedup keys, delayed delivery and priority). What it cannot
-- do: read, change or delete any message (its own included), touch dead
-- letters, lanes, relays or the archive. To find out whether a dedup key
-- is pending, enqueue() and the Go writer read two columns, message_id and
-- dedup_key, of pending rows; nothing else of them is readable.

GRANT USAGE ON SCHEMA {{.Schema}} TO {{.Role}};

-- The columns writers fill (README: the outbox table contract), plus the
-- optional ones the Go writer and enqueue() set: message_id (client ids),
-- dedup_key (idempotent enqueue), available_at (delayed delivery),
-- priority.
GRANT INSERT (message_id, topic, key, payload, headers, dedup_key, available_at, priority)
    ON {{.Schema}}.messages TO {{.Role}};
-- RETURNING message_id, and the lookup of a pending dedup key.
GRANT SELECT (message_id, dedup_key) ON {{.Schema}}.messages TO {{.Role}};
-- The id column is an identity; its sequence is used by every insert.
GRANT USAGE ON SEQUENCE {{.Schema}}.messages_id_seq TO {{.Role}};

-- Functions run with the caller's privileges. PUBLIC may execute them by
-- default; the grants keep working where that default was revoked.
GRANT EXECUTE ON FUNCTION
    {{.Schema}}.enqueue(text, text, bytea, jsonb, timestamptz, text, integer),
    {{.Schema}}.enqueue(text, text, jsonb, jsonb, timestamptz, text, integer),
    {{.Schema}}.enqueue(text, text, text, jsonb, timestamptz, text, integer),
    {{.Schema}}.check_headers(jsonb),
    {{.Schema}}.notify_relay()
    TO {{.Role}};
