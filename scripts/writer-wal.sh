#!/bin/bash
# What a relay draining the outbox makes the database write while the
# application writes: 16 pgbench clients insert one row per transaction
# into the outbox for DURATION seconds, with no relay and then with each binary
# given (alternated N times), and the script prints the writers' rate,
# the WAL written per message (pg_stat_wal, writers and relay together,
# until the relay drained everything) and the CPU time of the relay
# process and of its database sessions (from /proc: run it on the
# database's host, with pgbench installed).
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   scripts/writer-wal.sh /tmp/old /tmp/new
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SCHEMA=${SCHEMA:-writer_wal} DURATION=${DURATION:-8} N=${N:-2}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
DATABASE_URL=$DB "$1" migrate --schema "$SCHEMA" >/dev/null 2>&1
script=$(mktemp)
trap 'rm -f "$script"; psql -q "$DB" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1' EXIT
cat >"$script" <<SQL
\set k random(1, 1000)
INSERT INTO $SCHEMA.messages (topic, key, payload) VALUES ('bench', 'key-' || :k, convert_to(repeat('x', 200), 'UTF8'));
SQL
q() { psql -q -At "$DB" -c "$1"; }
cpu() { # clock ticks of user + system time of the given pids
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
run() { # binary or "none"
  local bin=$1 rpid="" bpids="" w0 w1 r0=0 r1=0 b0=0 b1=0 tps
  q "TRUNCATE $SCHEMA.messages" >/dev/null
  if [ "$bin" != none ]; then
    DATABASE_URL=$DB "$bin" run --schema "$SCHEMA" --sink discard --admin-addr 127.0.0.1:0 --log-level warn &
    rpid=$!
    sleep 2
    bpids=$(q "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE application_name = 'outbox-relay'")
    r0=$(cpu "$rpid") b0=$(cpu $bpids)
  fi
  q "CHECKPOINT" >/dev/null # every run starts with the same full-page images to write
  w0=$(q "SELECT wal_bytes FROM pg_stat_wal")
  tps=$(pgbench -n -M prepared -f "$script" -c 16 -j 2 -T "$DURATION" "$DB" 2>&1 | grep -oP 'tps = \K[0-9]+')
  if [ -n "$rpid" ]; then
    r1=$(cpu "$rpid") b1=$(cpu $bpids)
    for _ in $(seq 600); do # until drained, at most a minute
      [ "$(q "SELECT count(*) FROM $SCHEMA.messages")" = 0 ] && break
      sleep 0.1
    done
  fi
  w1=$(q "SELECT wal_bytes FROM pg_stat_wal")
  [ -n "$rpid" ] && { kill "$rpid"; wait "$rpid" 2>/dev/null || true; }
  printf '%-24s writers %6s tx/s  WAL %5s B/message  relay CPU %5.2f s  relay sessions CPU %5.2f s\n' \
    "$(basename "$bin")" "$tps" $(((w1 - w0) / (tps * DURATION))) "$(echo "($r1 - $r0) / 100" | bc -l)" "$(echo "($b1 - $b0) / 100" | bc -l)"
}
for _ in $(seq "$N"); do
  run none
  for bin in "$@"; do run "$bin"; done
done
