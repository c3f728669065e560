-- outbox-relay: least-privilege role for `outbox-relay run` (the relay).
--
-- Optional. This file is NOT an embedded migration: `outbox-relay migrate`
-- never runs it. Apply it yourself, as the owner of the outbox schema,
-- after `outbox-relay migrate`, to a role that already exists:
--
--   CREATE ROLE outbox_relay LOGIN PASSWORD '...';
--   sed -e 's/{{.Schema}}/"outbox"/g' -e 's/{{.Role}}/"outbox_relay"/g' relay.sql | psql "$DATABASE_URL"
--
-- {{.Schema}} and {{.Role}} are quoted identifiers (write them with double
-- quotes, as above), exactly like the migrations' {{.Schema}}.
--
-- The relay reads and settles messages, writes dead letters, keeps its
-- registration and lane leases, and reads the schema version. It cannot
-- insert messages, change the schema or delete dead letters (that is
-- operator.sql). It runs migrations only with --migrate, which needs the
-- schema owner instead.
--
-- Relays of one schema may run under different roles: fast failover
-- matches another role's session by process id when pg_stat_activity
-- hides its backend_start (see docs/security.md).
--
-- --archive is not covered: creating the archive's daily partitions needs
-- ownership of {{.Schema}}.archive. Run a relay with --archive as the
-- schema owner, or make this role the owner of the archive table.

GRANT USAGE ON SCHEMA {{.Schema}} TO {{.Role}};
GRANT SELECT ON {{.Schema}}.schema_migrations TO {{.Role}};
-- Claim (SELECT ... FOR UPDATE), retry scheduling (UPDATE), delivered and
-- dead-lettered rows (DELETE).
GRANT SELECT, UPDATE, DELETE ON {{.Schema}}.messages TO {{.Role}};
-- The identity's last value, read once a second by the watcher: after
-- TRUNCATE ... RESTART IDENTITY (or a restore) new ids are below those it
-- has seen, and it looks from the start again. Without this grant it
-- cannot tell, and such rows wait for the workers' --poll-interval.
GRANT SELECT ON SEQUENCE {{.Schema}}.messages_id_seq TO {{.Role}};
-- INSERT ... ON CONFLICT DO UPDATE when a replayed message dies again; the
-- backlog gauges count them.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.dead_letters TO {{.Role}};
-- Fan-out: the router copies messages in (INSERT); destinations claim,
-- retry and settle their copies like messages.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.deliveries TO {{.Role}};
-- Registration, heartbeat, reaping dead relays.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.relays TO {{.Role}};
-- Lane leases; the lanes of a new route are created on first use.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.lanes TO {{.Role}};
