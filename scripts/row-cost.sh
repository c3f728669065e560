#!/bin/bash
# What one outbox row costs its writer, in the database backend's CPU time
# (user + system from /proc, so a busy machine changes the figures little):
# ROWS single-statement inserts (INSERT … SELECT generate_series) into a
# plain table with the outbox's four writer columns, and into the outbox
# of schemas migrated by OLD and NEW, with empty headers and with two
# headers, N rounds alternated. Run it on the database's host (it reads
# /proc/<backend pid>/stat).
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   OLD=/tmp/old NEW=/tmp/new scripts/row-cost.sh
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
OLD=${OLD:-/tmp/old} NEW=${NEW:-/tmp/new} ROWS=${ROWS:-100000} N=${N:-5}
H='{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","type":"OrderPlaced"}'
cpu_ms() { # table headers-json: backend CPU milliseconds for ROWS inserts
  local f
  f=$(mktemp)
  psql -q -At "$DB" -v ON_ERROR_STOP=1 >/dev/null <<SQL
TRUNCATE $1;
SELECT pg_backend_pid() AS pid \gset
\setenv PID :pid
\! awk '{print \$14 + \$15}' /proc/\$PID/stat > $f.0
INSERT INTO $1 (topic, key, payload, headers)
SELECT 'bench', 'key-' || (i % 1000), decode(repeat('ab', 200), 'hex'), '$2'::jsonb FROM generate_series(1, $ROWS) i;
\! awk '{print \$14 + \$15}' /proc/\$PID/stat > $f.1
SQL
  echo $(( ($(cat "$f.1") - $(cat "$f.0")) * 1000 / $(getconf CLK_TCK) ))
  rm -f "$f" "$f.0" "$f.1"
}
psql -q "$DB" -c 'DROP SCHEMA IF EXISTS rc_old CASCADE; DROP SCHEMA IF EXISTS rc_new CASCADE; DROP SCHEMA IF EXISTS rc_plain CASCADE;' >/dev/null 2>&1
"$OLD" migrate --database-url "$DB" --schema rc_old --log-level error
"$NEW" migrate --database-url "$DB" --schema rc_new --log-level error
psql -q "$DB" -c "CREATE SCHEMA rc_plain; CREATE TABLE rc_plain.t (topic text NOT NULL, key text, payload bytea NOT NULL, headers jsonb NOT NULL DEFAULT '{}');"
echo "backend CPU ms per $ROWS rows: plain | old | new | old, 2 headers | new, 2 headers"
for i in $(seq 1 "$N"); do
  echo "run $i $(cpu_ms rc_plain.t '{}') $(cpu_ms rc_old.messages '{}') $(cpu_ms rc_new.messages '{}') $(cpu_ms rc_old.messages "$H") $(cpu_ms rc_new.messages "$H")"
done
psql -q "$DB" -c 'DROP SCHEMA rc_old CASCADE; DROP SCHEMA rc_new CASCADE; DROP SCHEMA rc_plain CASCADE;' >/dev/null 2>&1
