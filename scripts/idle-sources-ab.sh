#!/bin/bash
# A/B of an idle source's relay CPU (issue 50's line: at most 0.002 of a
# core a source, 50 sources in one process, polling): two relay binaries
# run at the same time, each on its own SOURCES empty databases of one
# throwaway cluster, so that both read the same windows of a noisy
# machine (the same binary alone moved by ±20 % from one 30 s window to
# the next, more than the effects measured). The second run swaps the
# two sets of databases. Prints, for each WINDOW-second window after
# SETTLE seconds, each process's CPU a source and B ÷ A, then its read
# and write syscalls and context switches a second (counts, not time:
# they say what a change changed even when the CPU figures are noise).
#
#   go build -o /tmp/a ./cmd/outbox-relay    # before
#   go build -o /tmp/b ./cmd/outbox-relay    # after
#   A=/tmp/a B=/tmp/b scripts/idle-sources-ab.sh
#
# Needs initdb/pg_ctl and psql (see throwaway-pg.sh); about
# 2 × (SETTLE + WINDOWS × WINDOW) seconds after the databases exist.
set -euo pipefail
A=${A:-/tmp/a} B=${B:-/tmp/b}
SOURCES=${SOURCES:-50} SETTLE=${SETTLE:-40} WINDOWS=${WINDOWS:-4} WINDOW=${WINDOW:-30}
. "$(dirname "$0")/throwaway-pg.sh"
throwaway_pg idle-sources-ab -c max_connections=$((8 * SOURCES + 50))
base=${DB%/postgres}

# configs SET writes $dir/SET.yaml, a sources list of SOURCES new
# databases named SET-1 …, migrated by A and then B.
configs() {
  local set=$1 i
  echo "sources:" >"$dir/$set.yaml"
  for i in $(seq 1 "$SOURCES"); do
    q "CREATE DATABASE \"$set-$i\"" >/dev/null
    # Both binaries run on both sets: each migrates (B's may be newer).
    DATABASE_URL="$base/$set-$i" "$A" migrate --log-level error >/dev/null
    DATABASE_URL="$base/$set-$i" "$B" migrate --log-level error >/dev/null
    printf '  - name: %s-%s\n    database-url: %s/%s-%s\n' "$set" "$i" "$base" "$set" "$i" >>"$dir/$set.yaml"
  done
}
configs x
configs y

# snap PID prints its CPU ticks, read and write syscalls and context
# switches (every thread's) so far.
snap() {
  local p=$1
  echo "$(awk '{print $14 + $15}' "/proc/$p/stat") $(awk '/^syscr/ {print $2}' "/proc/$p/io") $(awk '/^syscw/ {print $2}' "/proc/$p/io") $(cat /proc/"$p"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}')"
}

# pair CONFIG_A CONFIG_B runs A on the first and B on the second.
pair() {
  local pa pb w a0 b0 a1 b1 t0 t1
  "$A" run --config "$1" --wakeup poll --sink discard --admin-addr 127.0.0.1:0 --log-level error >/dev/null 2>&1 &
  pa=$!
  "$B" run --config "$2" --wakeup poll --sink discard --admin-addr 127.0.0.1:0 --log-level error >/dev/null 2>&1 &
  pb=$!
  sleep "$SETTLE"
  for w in $(seq 1 "$WINDOWS"); do
    a0=$(snap $pa) b0=$(snap $pb) t0=$(date +%s.%N)
    sleep "$WINDOW"
    a1=$(snap $pa) b1=$(snap $pb) t1=$(date +%s.%N)
    python3 - "$a0" "$a1" "$b0" "$b1" "$t0" "$t1" "$SOURCES" "$(basename "$1" .yaml)" <<'EOF'
import sys
a0, a1, b0, b1 = ([float(x) for x in s.split()] for s in sys.argv[1:5])
el, n = float(sys.argv[6]) - float(sys.argv[5]), int(sys.argv[7])
cpu = lambda s0, s1: (s1[0] - s0[0]) / 100 / el / n
rate = lambda s0, s1, i: (s1[i] - s0[i]) / el
ca, cb = cpu(a0, a1), cpu(b0, b1)
print("A on %s: A %.5f B %.5f core a source, B/A %.3f | reads/s %.0f %.0f, writes/s %.0f %.0f, switches/s %.0f %.0f" % (
    sys.argv[8], ca, cb, cb / ca, rate(a0, a1, 1), rate(b0, b1, 1), rate(a0, a1, 2), rate(b0, b1, 2), rate(a0, a1, 3), rate(b0, b1, 3)))
EOF
  done
  kill $pa $pb
  wait $pa $pb 2>/dev/null || true
}
pair "$dir/x.yaml" "$dir/y.yaml"
pair "$dir/y.yaml" "$dir/x.yaml"
