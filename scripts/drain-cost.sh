#!/bin/bash
# Where a backlog drain's database time goes, statement by statement: the
# raw-SQL yardstick (pgbench, 2 clients, each transaction one
# DELETE … WHERE id IN (SELECT … ORDER BY id LIMIT 500 FOR UPDATE SKIP
# LOCKED) RETURNING …, synchronous_commit off, as the bench's raw loop)
# against each relay binary given (run --sink discard, default settings).
# A throwaway PostgreSQL cluster of its own, with pg_stat_statements and
# the shared server's settings that matter here (shared_buffers 128MB,
# autovacuum off); a backlog of N rows (1,000 keys, 200-byte payloads)
# loaded and checkpointed before each drain. Per drain it prints the wall
# time, the rate, the CPU the drainer's process used, and for each
# statement: calls, execution time per message (µs), buffers and WAL bytes
# per message. Runs alternate R times.
#
#   go build -o /tmp/relay ./cmd/outbox-relay
#   N=200000 R=2 scripts/drain-cost.sh /tmp/relay
#   RELAY_ARGS='--config routes.yaml' scripts/drain-cost.sh /tmp/relay   # e.g. fan-out
#
# RELAY_ARGS replaces `--sink discard`; the drain ends when neither the
# outbox nor the fan-out copies hold a row. COPIES_TO=all,copy loads the
# backlog as fan-out copies for those routes instead (the destinations'
# work alone; RELAY_ARGS must configure routes of those names) and skips
# the raw loop. PG_SETTINGS adds server settings, e.g.
#   PG_SETTINGS='-c shared_preload_libraries=pg_stat_statements,auto_explain
#     -c auto_explain.log_min_duration=0 -c auto_explain.log_analyze=on
#     -c auto_explain.sample_rate=0.02'
# and PG_LOG=/tmp/pg.log keeps the cluster's log (where auto_explain
# writes its plans).
#
# Needs initdb/pg_ctl and pgbench (Debian: postgresql); run as root, the
# server runs as the OS user postgres.
set -euo pipefail
N=${N:-200000} R=${R:-2}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
. "$(dirname "$0")/throwaway-pg.sh"
throwaway_pg drain-cost -c shared_buffers=128MB -c autovacuum=off -c max_wal_size=1GB \
  -c pg_stat_statements.track_utility=off ${PG_SETTINGS:-}
cat >"$dir/raw.sql" <<'SQL'
DELETE FROM outbox.messages WHERE id IN (SELECT id FROM outbox.messages ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING id, topic, key, payload, headers;
SQL
# A binary to migrate with: the first one given.
migrate_bin=$1

load() {
  if [ -z "${COPIES_TO:-}" ]; then
    load_backlog "$migrate_bin" "$N"
  else # the backlog as fan-out copies, one per route listed
    load_backlog "$migrate_bin" "$N" \
      "INSERT INTO outbox.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
       SELECT r, m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at, m.dedup_key, m.priority
       FROM outbox.messages m, unnest(string_to_array('$COPIES_TO', ',')) r" \
      "TRUNCATE outbox.messages" "VACUUM ANALYZE outbox.deliveries"
  fi
}

report() { # name seconds drainer_cpu_seconds busy_cpu_seconds
  local name=$1 secs=$2 cpu=$3 busy=$4
  printf '%-14s %6.2f s %7.0f msg/s  CPU µs/msg: all %5.2f, drainer %5.2f, rest (the database) %5.2f; cores busy %4.2f\n' \
    "$name" "$secs" "$(echo "$N / $secs" | bc -l)" "$(echo "$busy * 1000000 / $N" | bc -l)" \
    "$(echo "$cpu * 1000000 / $N" | bc -l)" "$(echo "($busy - $cpu) * 1000000 / $N" | bc -l)" "$(echo "$busy / $secs" | bc -l)"
  q "SELECT format('    %6s calls %8s µs/msg %6s hit/msg %5s read/msg %5s dirtied/msg %6s WAL B/msg  %s',
       calls, round((total_exec_time * 1000 / $N)::numeric, 2),
       round(shared_blks_hit::numeric / $N, 2), round(shared_blks_read::numeric / $N, 2),
       round(shared_blks_dirtied::numeric / $N, 2), round(wal_bytes / $N, 0),
       left(regexp_replace(query, '\s+', ' ', 'g'), 90))
     FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres')
       AND total_exec_time * 1000 / $N >= 0.05
     ORDER BY total_exec_time DESC LIMIT 8"
  q "SELECT format('    total %s µs/msg in statements', round((sum(total_exec_time) * 1000 / $N)::numeric, 2)) FROM pg_stat_statements"
}

busy() { # CPU seconds the whole machine spent busy so far
  awk '/^cpu / {print ($2 + $3 + $4 + $7 + $8) / 100}' /proc/stat
}

cpu_of() { # pid -> utime+stime in seconds (children included)
  awk '{print ($14 + $15 + $16 + $17) / 100}' "/proc/$1/stat"
}

raw() {
  load
  local t0 t1 b0 b1
  b0=$(busy)
  t0=$(date +%s.%N)
  PGOPTIONS='-c synchronous_commit=off' /usr/bin/time -f '%U %S' -o "$dir/time" \
    pgbench -n -M prepared -f "$dir/raw.sql" -c 2 -j 2 -t $((N / 1000 + 2)) "$DB" >/dev/null 2>&1
  t1=$(date +%s.%N)
  b1=$(busy)
  [ "$(q "SELECT count(*) FROM outbox.messages")" = 0 ] || echo "raw: rows left" >&2
  report raw "$(echo "$t1 - $t0" | bc -l)" "$(awk '{print $1 + $2}' "$dir/time")" "$(echo "$b1 - $b0" | bc -l)"
}

relay() {
  local b=$1 rpid t0 t1 b0 b1 cpu
  load
  b0=$(busy)
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # RELAY_ARGS is a list of arguments
  DATABASE_URL=$DB "$b" run ${RELAY_ARGS:---sink discard} --admin-addr '' --log-level warn &
  rpid=$!
  # One psql session polls (a psql started per look cost a tenth of a
  # core); the start-up, until the first row is gone, is printed apart.
  coproc POLL { psql -q -At "$DB"; }
  local first='' left
  [ -z "${COPIES_TO:-}" ] || first=$t0 # (no start-up figure)
  while [ -z "$first" ]; do # a count until the first row is gone
    echo "SELECT count(*) < $N FROM outbox.messages;" >&"${POLL[1]}"
    read -r left <&"${POLL[0]}"
    [ "$left" = t ] && first=$(date +%s.%N)
    sleep 0.01
  done
  while :; do
    echo "SELECT NOT EXISTS (SELECT 1 FROM outbox.messages ORDER BY id LIMIT 1) AND NOT EXISTS (SELECT 1 FROM outbox.deliveries);" >&"${POLL[1]}"
    read -r left <&"${POLL[0]}"
    [ "$left" = t ] && break
    sleep 0.01
  done
  t1=$(date +%s.%N)
  exec {POLL[1]}>&-
  wait "$POLL_PID" 2>/dev/null || true
  b1=$(busy)
  cpu=$(cpu_of "$rpid")
  kill "$rpid"; wait "$rpid" 2>/dev/null || true
  report "$(basename "$b")" "$(echo "$t1 - $t0" | bc -l)" "$cpu" "$(echo "$b1 - $b0" | bc -l)"
  [ -n "${COPIES_TO:-}" ] ||
    printf '    start-up (until the first row was gone) %.2f s\n' "$(echo "$first - $t0" | bc -l)"
}

echo "backlog $N rows, 1,000 keys, 200-byte payloads"
for _ in $(seq "$R"); do
  [ -n "${COPIES_TO:-}" ] || raw
  for b in "$@"; do relay "$b"; done
done
