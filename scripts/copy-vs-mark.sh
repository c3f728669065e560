#!/bin/bash
# What the fan-out router's write costs per message, against the write a
# design without the first route's copy would need instead. Fan-out today
# copies each message into `deliveries` once per destination and deletes
# it from the outbox; reading the outbox directly for the first route
# needs a state on the outbox row ("copied for the fan-out routes, not yet
# delivered to the first"), so an UPDATE of every fed row. Each statement
# runs alone, on one connection, over a backlog of N rows (1,000 keys,
# 200-byte payloads) in batches of 500 taken lane by lane as the claim
# takes them, on a throwaway cluster (the state column is added there
# only). It prints, per row: the backend's CPU (from /proc, so a busy
# machine changes it little), execution time, buffers and WAL.
#
#   go build -o /tmp/relay ./cmd/outbox-relay
#   N=100000 R=2 scripts/copy-vs-mark.sh /tmp/relay
#
# copy:   INSERT INTO deliveries … SELECT … FROM messages WHERE ctid = ANY(…)
#         (the router's statement, one destination)
# mark:   UPDATE messages SET copied = true WHERE ctid = ANY(…)
#         (the state; the column is in no index, yet the pages are full, so
#         the new row versions go to other pages with new index entries)
# delete: DELETE FROM messages WHERE ctid = ANY(…)
#
# Needs initdb/pg_ctl (Debian: postgresql); run as root, the server runs
# as the OS user postgres, on this host (the script reads /proc).
set -euo pipefail
N=${N:-100000} R=${R:-2}
[ $# -eq 1 ] || { echo "usage: $0 relay-binary" >&2; exit 2; }
bin=$1
. "$(dirname "$0")/throwaway-pg.sh"
throwaway_pg copy-vs-mark -c shared_buffers=128MB -c autovacuum=off -c max_wal_size=1GB \
  -c pg_stat_statements.track_utility=off -c synchronous_commit=off

load() {
  load_backlog "$bin" "$N" "ALTER TABLE outbox.messages ADD COLUMN copied boolean" \
    "CREATE TABLE outbox.batches AS SELECT (row_number() OVER (ORDER BY lane, id) - 1) / 500 AS b, ctid AS t FROM outbox.messages"
}

run() { # name statement-template (%s: the batch's ctid array, a literal)
  local f
  f=$(mktemp)
  load
  # One session runs every batch; its CPU is read from /proc around them.
  psql -q -At -v ON_ERROR_STOP=1 -v tmpl="$2" "$DB" >/dev/null <<SQL
SELECT pg_backend_pid() AS pid \gset
\setenv PID :pid
\! awk '{print \$14 + \$15}' /proc/\$PID/stat > $f.0
SELECT format(:'tmpl', quote_literal(array_agg(t)::text)) FROM outbox.batches GROUP BY b ORDER BY b
\gexec
\! awk '{print \$14 + \$15}' /proc/\$PID/stat > $f.1
SQL
  local cpu
  cpu=$(echo "($(cat "$f.1") - $(cat "$f.0")) * 1000000 / $(getconf CLK_TCK) / $N" | bc -l)
  rm -f "$f" "$f.0" "$f.1"
  q "SELECT format('%-7s CPU %5s µs/row; exec %5s µs/row, %5s buffers/row, %5s WAL B/row', '$1', round($cpu, 1),
       round((sum(total_exec_time) * 1000 / $N)::numeric, 1), round(sum(shared_blks_hit + shared_blks_read)::numeric / $N, 1),
       round(sum(wal_bytes) / $N, 0))
     FROM pg_stat_statements WHERE query ~ '^(INSERT INTO outbox.deliveries|UPDATE outbox.messages|DELETE FROM outbox.messages)'"
}

echo "backlog $N rows, 1,000 keys, 200-byte payloads, batches of 500 lane by lane"
for _ in $(seq "$R"); do
  run copy "INSERT INTO outbox.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
    SELECT 'copy', m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at, m.dedup_key, m.priority
    FROM outbox.messages m WHERE m.ctid = ANY(%s::tid[])"
  run mark "UPDATE outbox.messages SET copied = true WHERE ctid = ANY(%s::tid[])"
  run delete "DELETE FROM outbox.messages WHERE ctid = ANY(%s::tid[])"
done
