#!/bin/bash
# What the relay's claims cost the database at a steady write rate: a
# throwaway PostgreSQL cluster of its own (pg_stat_statements loaded, and
# wal_level = logical with WAL=1), one relay into discard with --wakeup
# MODE, 4 pgbench clients offering RATE single-row inserts a second for
# DURATION seconds; then, once the relay has drained, the claim
# statements' count and execution time (pg_stat_statements), the
# database's transactions per message (pg_stat_database) and the writers'
# average latency. The binaries given are alternated N times, each on a
# fresh schema.
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   MODE=poll RATE=1000 scripts/claim-cost.sh /tmp/old /tmp/new
#   WAL=1 MODE=wal RATE=1000 scripts/claim-cost.sh /tmp/old /tmp/new
#
# Needs initdb/pg_ctl (Debian: postgresql) and pgbench; run as root, the
# server runs as the OS user postgres.
set -euo pipefail
MODE=${MODE:-poll} RATE=${RATE:-1000} DURATION=${DURATION:-10} N=${N:-2} WAL=${WAL:-0}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
wal=replica
[ "$WAL" = 1 ] && wal=logical
. "$(dirname "$0")/throwaway-pg.sh"
throwaway_pg claim-cost -c wal_level=$wal
cat >"$dir/ins.sql" <<'SQL'
\set k random(1, 1000)
INSERT INTO outbox.messages (topic, key, payload) VALUES ('bench', 'key-' || :k, convert_to(repeat('x', 200), 'UTF8'));
SQL
run() {
  local b=$1 rpid x0 x1 lat left
  q "DROP SCHEMA IF EXISTS outbox CASCADE; DROP PUBLICATION IF EXISTS outbox_relay" >/dev/null 2>&1
  DATABASE_URL=$DB "$b" migrate >/dev/null 2>&1
  DATABASE_URL=$DB "$b" run --sink discard --wakeup "$MODE" --admin-addr '' --log-level warn &
  rpid=$!
  sleep 3
  x0=$(q "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'")
  q "SELECT pg_stat_statements_reset()" >/dev/null
  lat=$(pgbench -n -f "$dir/ins.sql" -c 4 -j 2 -R "$RATE" -T "$DURATION" "$DB" 2>&1 | grep -oP 'latency average = \K[0-9.]+')
  for _ in $(seq 300); do # until drained, at most 30 s
    left=$(q "SELECT count(*) FROM outbox.messages")
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  sleep 11 # idle backends report their transactions up to 10 s late
  x1=$(q "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'")
  kill "$rpid"; wait "$rpid" 2>/dev/null || true
  q "SELECT format('%-22s claims %6s  claim time %7s ms  %5s ms/claim  messages/claim %5s  transactions/message (writers included) %5s  writers latency %6s ms  left %s',
       '$(basename "$b")', sum(calls), round(sum(total_exec_time)::numeric), round((sum(total_exec_time) / nullif(sum(calls), 0))::numeric, 3),
       round(($RATE * $DURATION)::numeric / nullif(sum(calls), 0), 1), round(($x1 - $x0)::numeric / ($RATE * $DURATION), 2), '$lat', '$left')
     FROM pg_stat_statements WHERE query LIKE '%c.found%' OR query LIKE '%row_ctid%'"
}
echo "mode=$MODE wal_level=$wal rate=$RATE/s duration=${DURATION}s"
for _ in $(seq "$N"); do
  for b in "$@"; do run "$b"; done
done
