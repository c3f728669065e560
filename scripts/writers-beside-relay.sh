#!/bin/bash
# What a draining relay costs writers at their full speed, and what its
# claims cost the database: a throwaway PostgreSQL cluster of its own
# (pg_stat_statements loaded; shared_buffers 128MB and autovacuum off, as
# on the test machine's shared server; AUTOVACUUM=on to turn it on), one
# relay into discard, 16 pgbench clients each committing single-row
# inserts back to back for DURATION seconds. Printed per run: the
# writers' tx/s, the relay process's CPU and its database sessions' CPU
# (from /proc, over the writers' run), and the claim statement's calls,
# time per call and shared buffers per claimed row. The binaries given are
# alternated N times, each on a fresh schema.
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   N=2 scripts/writers-beside-relay.sh /tmp/old /tmp/new
#   NORELAY=1 N=1 scripts/writers-beside-relay.sh /tmp/new   # the outbox alone
#   N=3 WAITS=1 scripts/writers-beside-relay.sh none /tmp/new   # alternated with the outbox alone
#
# "none" in place of a binary is a run with no relay, in the same cluster
# as the others, so that the writers' rate beside a relay can be read
# against theirs alone in one session. WAITS=1 also prints what the
# writers' and the relay's sessions were waiting on, sampled every 10 ms
# from pg_stat_activity (W: a writer, R: the relay; CPU: not waiting).
#
# Needs initdb/pg_ctl (Debian: postgresql) and pgbench; run as root, the
# server runs as the OS user postgres.
#
# Measured with it (2 cores, PG 15; README, "Claims among dead rows, and
# wake-ups at full speed"), the last release against this one, N=2:
#   relay        writers 6310 tx/s  relay CPU 1580 ms  its sessions 2320 ms  claims 2314  1.469 ms/claim  49.9 buffers/claimed row
#   relay-head   writers 7571 tx/s  relay CPU  810 ms  its sessions 1180 ms  claims 1340  1.064 ms/claim  13.8 buffers/claimed row
#   relay        writers 6837 tx/s  relay CPU 1550 ms  its sessions 1300 ms  claims 2219  0.634 ms/claim  14.3 buffers/claimed row
#   relay-head   writers 7427 tx/s  relay CPU  870 ms  its sessions 1190 ms  claims 1356  1.018 ms/claim  14.1 buffers/claimed row
# The last release's claim fell into the bitmap plan in some runs only
# (the first here): Postgres settles on a prepared statement's generic
# plan at its sixth execution, from the statistics and the custom plans
# it has seen; TestClaimPlanOnDeadRows forces the generic plan.
set -euo pipefail
DURATION=${DURATION:-8} N=${N:-2} AUTOVACUUM=${AUTOVACUUM:-off} NORELAY=${NORELAY:-0} WAITS=${WAITS:-0}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
migrator=""
for b in "$@"; do [ "$b" = none ] || migrator=${migrator:-$b}; done
[ -n "$migrator" ] || { echo "$0: a relay binary is needed to create the schema" >&2; exit 2; }
. "$(dirname "$0")/throwaway-pg.sh"
throwaway_pg writers-beside -c shared_buffers=128MB -c max_wal_size=1GB -c autovacuum=$AUTOVACUUM
cat >"$dir/ins.sql" <<'SQL'
\set k random(1, 1000)
INSERT INTO outbox.messages (topic, key, payload) VALUES ('bench', 'key-' || :k, convert_to(repeat('x', 200), 'UTF8'));
SQL
# cpu_ms PID...: user + system CPU of the processes, in ms.
cpu_ms() {
  local t=0 p v
  for p in "$@"; do
    v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo $((t * 1000 / $(getconf CLK_TCK)))
}
run() {
  local b=$1 rpid="" sessions="" r0=0 b0=0 r1=0 b1=0 tps
  q "DROP SCHEMA IF EXISTS outbox CASCADE" >/dev/null 2>&1
  DATABASE_URL=$DB "$migrator" migrate >/dev/null 2>&1
  # Statistics of a small outbox (ten rows a lane), as autovacuum's
  # ANALYZE leaves them on a table that a relay keeps nearly empty: the
  # relay plans its claim with them.
  q "INSERT INTO outbox.messages (topic, key, payload) SELECT 'bench', 'key-' || g % 1000, convert_to('x', 'UTF8') FROM generate_series(1, 2560) g" >/dev/null
  q "ANALYZE outbox.messages" >/dev/null
  q "DELETE FROM outbox.messages" >/dev/null
  q "CHECKPOINT" >/dev/null
  if [ "$NORELAY" != 1 ] && [ "$b" != none ]; then
    DATABASE_URL=$DB "$b" run --sink discard --admin-addr '' --log-level warn &
    rpid=$!
    sleep 2
    sessions=$(q "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE application_name = 'outbox-relay'")
    r0=$(cpu_ms "$rpid"); b0=$(cpu_ms $sessions)
  fi
  q "SELECT pg_stat_statements_reset()" >/dev/null
  q "SELECT pg_stat_reset_shared('wal')" >/dev/null
  local wpid=""
  if [ "$WAITS" = 1 ]; then
    printf '%s \\watch 0.01\n' "SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') || CASE WHEN application_name = 'pgbench' THEN ' W' ELSE ' R' END
      FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND (application_name = 'pgbench' OR application_name LIKE 'outbox-relay%')" |
      timeout "$DURATION" psql -q -At "$DB" >"$dir/waits" 2>/dev/null &
    wpid=$!
  fi
  tps=$(pgbench -n -f "$dir/ins.sql" -c 16 -j 2 -T "$DURATION" "$DB" 2>&1 | grep -oP 'tps = \K[0-9.]+' | head -1)
  if [ -n "$wpid" ]; then
    wait "$wpid" || true
    grep -v '^$' "$dir/waits" | sort | uniq -c | sort -rn | head -8 | awk -v n="$(grep -vc '^$' "$dir/waits")" '{printf "    %5.1f%%  %s %s\n", 100 * $1 / n, $2, $3}'
  fi
  if [ -n "$rpid" ]; then
    r1=$(cpu_ms "$rpid"); b1=$(cpu_ms $sessions)
    kill "$rpid"; wait "$rpid" 2>/dev/null || true
  fi
  q "SELECT format('%-20s writers %7s tx/s  relay CPU %5s ms  its sessions %5s ms  claims %6s  %6s ms/claim  %6s buffers/claimed row',
       '$(basename "$b")', round($tps), $((r1 - r0)), $((b1 - b0)), coalesce(sum(calls), 0),
       coalesce(round((sum(total_exec_time) / nullif(sum(calls), 0))::numeric, 3), 0),
       coalesce(round(sum(shared_blks_hit + shared_blks_read)::numeric / nullif(sum(rows), 0), 1), 0))
     FROM pg_stat_statements WHERE query LIKE '%c.found%'"
  # The WAL the run wrote, per writer transaction, and how often it was
  # flushed: the writers commit synchronously, so they wait for these.
  q "SELECT format('%-20s WAL %s bytes, %s records, %s full-page images a writer tx; %s flushes/s', '',
       round(wal_bytes / ($tps * $DURATION)), round(wal_records / ($tps * $DURATION), 2), round(wal_fpi / ($tps * $DURATION), 3),
       round(wal_sync / $DURATION::numeric)) FROM pg_stat_wal"
}
echo "16 writers, ${DURATION}s a run, autovacuum=$AUTOVACUUM$([ "$NORELAY" = 1 ] && echo ', no relay')"
for _ in $(seq "$N"); do
  for b in "$@"; do run "$b"; done
done
