#!/bin/bash
# How fast a relay that has been running on a nearly empty outbox drains a
# backlog that appears at once (a writer's bulk insert, a sink back after
# an outage), against a relay started on the same backlog. The relay's
# statements are planned once per session, while the outbox is small; no
# ANALYZE runs in between (autovacuum is off for the table, as it may not
# have come round yet in production). For each binary given, alternated N
# times: "warm" (the relay runs, delivers 60 single rows, then BACKLOG rows
# are inserted in one transaction) and "cold" (the relay starts after the
# insert); the time is from the insert's start to an empty outbox.
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   scripts/burst-after-idle.sh /tmp/old /tmp/new
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SCHEMA=${SCHEMA:-burst_after_idle} BACKLOG=${BACKLOG:-200000} N=${N:-1}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
q() { psql -q -At "$DB" -c "$1"; }
cleanup() { q "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true; }
trap cleanup EXIT
run() { # binary, warm|cold
  local bin=$1 mode=$2 rpid="" t0 t1 left
  cleanup
  DATABASE_URL=$DB "$bin" migrate --schema "$SCHEMA" >/dev/null 2>&1
  q "ALTER TABLE $SCHEMA.messages SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
  start() {
    DATABASE_URL=$DB "$bin" run --schema "$SCHEMA" --sink discard --wakeup poll --admin-addr '' --log-level error &
    rpid=$!
  }
  if [ "$mode" = warm ]; then
    start
    sleep 3
    for i in $(seq 60); do
      q "INSERT INTO $SCHEMA.messages (topic, key, payload) VALUES ('t', 'k$i', 'x')"
      sleep 0.05
    done
    sleep 1
  fi
  t0=$(date +%s.%N)
  q "INSERT INTO $SCHEMA.messages (topic, key, payload) SELECT 't', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $BACKLOG) g"
  [ "$mode" = cold ] && start
  for _ in $(seq 3000); do # at most 5 minutes
    left=$(q "SELECT count(*) FROM $SCHEMA.messages")
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  t1=$(date +%s.%N)
  kill "$rpid"; wait "$rpid" 2>/dev/null || true
  printf '%-24s %-4s %s rows: %6.1f s (left %s)\n' "$(basename "$bin")" "$mode" "$BACKLOG" "$(echo "$t1 - $t0" | bc -l)" "$left"
}
for _ in $(seq "$N"); do
  for bin in "$@"; do
    run "$bin" warm
    run "$bin" cold
  done
done
