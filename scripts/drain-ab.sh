#!/bin/bash
# How fast relay binaries drain a backlog, alternated N times: each run
# migrates a fresh schema, inserts BACKLOG rows over KEYS keys (200-byte
# payloads) in one transaction, then runs `outbox-relay run
# --exit-when-empty` into SINK; the time is from the relay's first lanes
# ("lanes rebalanced" in its log) to "outbox is empty", so the process's
# start-up is not counted. The relay's CPU (user + system, whole process)
# is printed beside it.
#
#   go build -o /tmp/old ./cmd/outbox-relay      # an older release
#   go build -o /tmp/new ./cmd/outbox-relay      # this tree
#   N=3 BACKLOG=100000 scripts/drain-ab.sh /tmp/old /tmp/new
#   SINK='http://127.0.0.1:8080/hook?max_concurrency=64' scripts/drain-ab.sh /tmp/new
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
S=${SCHEMA:-drain_ab} BACKLOG=${BACKLOG:-200000} KEYS=${KEYS:-1000} N=${N:-1} SINK=${SINK:-discard}
[ $# -ge 1 ] || { echo "usage: $0 relay-binary..." >&2; exit 2; }
q() { psql -q -At "$DB" -c "$1" 2>/dev/null; }
log=$(mktemp) cpu=$(mktemp)
cleanup() { q "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null 2>&1 || true; rm -f "$log" "$cpu"; }
trap cleanup EXIT
stamp() { sed -n "s/^time=\([^ ]*\) .*$1.*/\1/p" "$log" | head -1; }
for _ in $(seq "$N"); do
  for bin in "$@"; do
    q "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null
    "$bin" migrate --database-url "$DB" --schema "$S" --log-level error
    q "ALTER TABLE $S.messages SET (autovacuum_enabled = false)"
    q "INSERT INTO $S.messages (topic, key, payload) SELECT 't', 'k' || (g % $KEYS), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $BACKLOG) g"
    q "ANALYZE $S.messages"
    /usr/bin/time -o "$cpu" -f '%U %S' "$bin" run --database-url "$DB" --schema "$S" --sink "$SINK" \
      --exit-when-empty --admin-addr '' --log-level info 2>"$log"
    a=$(stamp 'lanes rebalanced') b=$(stamp 'outbox is empty')
    python3 -c 'import sys,datetime as d
f=lambda s: d.datetime.fromisoformat(s.replace("Z","+00:00"))
t=(f(sys.argv[3])-f(sys.argv[2])).total_seconds(); u,s=map(float,sys.argv[5].split())
print(f"{sys.argv[1]:<28} {int(sys.argv[4]):>8} rows {t:7.3f} s {int(sys.argv[4])/t:9.0f} msg/s  relay CPU {u+s:5.2f} s")' \
      "$(basename "$(dirname "$bin")")/$(basename "$bin")" "$a" "$b" "$BACKLOG" "$(cat "$cpu")"
  done
done
