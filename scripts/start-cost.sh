#!/bin/bash
# What starting relays costs the machine (the database included): N relay
# processes started together on an empty outbox, and the machine's CPU
# time (user + nice + system + irq + softirq, from /proc/stat) over their
# first W seconds. Run it where the database runs, on a quiet machine, with
# a migrated schema and nothing else using the database.
#
#   go build -o /tmp/relay ./cmd/outbox-relay
#   BIN=/tmp/relay N=16 W=1 scripts/start-cost.sh
#   BIN=/tmp/relay N=1 W=3 scripts/start-cost.sh
#
# Measured (2 cores, PG 15): 16 relays 2.1 CPU-seconds in their first
# second; one relay 0.3 in its first 3 s.
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
BIN=${BIN:-/tmp/relay} N=${N:-16} W=${W:-1}
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
psql -q "$DB" -c "DELETE FROM outbox.messages" >/dev/null
c0=$(cpu)
pids=()
for i in $(seq 1 "$N"); do
  "$BIN" run --database-url "$DB" --sink discard --admin-addr 127.0.0.1:0 --id "start-cost-$i" --log-level warn >/dev/null 2>&1 &
  pids+=($!)
done
sleep "$W"
c1=$(cpu)
kill -TERM "${pids[@]}" 2>/dev/null || true
wait
hz=$(getconf CLK_TCK)
echo "$N relays, first ${W}s: $(( (c1 - c0) * 1000 / hz )) ms of machine CPU"
