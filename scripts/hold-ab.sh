#!/bin/bash
# A/B drain of the plain path (issue 18): two relay binaries, one schema
# each, ROWS rows over 1000 keys, drained alternately with --sink discard
# --exit-when-empty; NEW runs twice, with --on-dead-letter skip and hold
# (nothing held). Prints each run's wall time in seconds.
#
#   go build -o /tmp/old ./cmd/outbox-relay      # on main
#   go build -o /tmp/new ./cmd/outbox-relay      # on the branch
#   OLD=/tmp/old NEW=/tmp/new ROWS=100000 N=11 scripts/hold-ab.sh
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
OLD=${OLD:-/tmp/old} NEW=${NEW:-/tmp/new} ROWS=${ROWS:-100000} N=${N:-5}
seed() { # schema
  psql -q "$DB" -v ON_ERROR_STOP=1 \
    -c "TRUNCATE \"$1\".messages; INSERT INTO \"$1\".messages (topic, key, payload) SELECT 'bench', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $ROWS) g;" \
    -c "VACUUM ANALYZE \"$1\".messages;" >/dev/null
}
drain() { # binary schema [flags...]
  local bin=$1 s=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" run --database-url "$DB" --schema "$s" --sink discard --exit-when-empty --admin-addr "" --log-level error "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
psql -q "$DB" -c 'DROP SCHEMA IF EXISTS ab_old CASCADE; DROP SCHEMA IF EXISTS ab_new CASCADE;' >/dev/null 2>&1
"$OLD" migrate --database-url "$DB" --schema ab_old --log-level error
"$NEW" migrate --database-url "$DB" --schema ab_new --log-level error
for i in $(seq 1 "$N"); do
  seed ab_old; o=$(drain "$OLD" ab_old)
  seed ab_new; n=$(drain "$NEW" ab_new)
  seed ab_new; h=$(drain "$NEW" ab_new --on-dead-letter hold)
  echo "run $i old $o new-skip $n new-hold $h"
done
psql -q "$DB" -c 'DROP SCHEMA ab_old CASCADE; DROP SCHEMA ab_new CASCADE;' >/dev/null 2>&1
