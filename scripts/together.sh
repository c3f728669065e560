#!/bin/bash
# N relay processes started together on a backlog of M messages (1,000
# keys, into discard): the time from their start until the outbox is
# empty, as one psql session sees it. The bench's `together` group does the
# same with samplers of the lanes and order checks; this is the bare
# measurement, for A/B pairs of binaries.
#
#   BIN=/tmp/relay N=1 scripts/together.sh; BIN=/tmp/relay N=16 scripts/together.sh
set -euo pipefail
DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
BIN=${BIN:-/tmp/relay} N=${N:-16} M=${M:-100000}
psql -q "$DB" -v ON_ERROR_STOP=1 >/dev/null <<SQL
TRUNCATE outbox.messages;
INSERT INTO outbox.messages (topic, key, payload)
SELECT 't', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $M) g;
SQL
psql -q "$DB" -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
pids=()
s=$(date +%s%N)
for i in $(seq 1 "$N"); do
  "$BIN" run --database-url "$DB" --sink discard --admin-addr 127.0.0.1:0 --id "together-$i" --log-level warn >/dev/null 2>&1 &
  pids+=($!)
done
# One short transaction per look: a loop inside one statement (a DO
# block) would hold back the xmin horizon for the whole run, so that no
# delivered row could be pruned and every claim would step over all of
# them (1M messages, one relay: 17k msg/s measured that way, 59-64k this way).
while [ -n "$(psql -At "$DB" -c "SELECT 1 FROM outbox.messages ORDER BY id LIMIT 1")" ]; do sleep 0.01; done
e=$(date +%s%N)
kill -TERM "${pids[@]}" 2>/dev/null || true
wait
echo "$N relays started together on $M messages: $(( (e - s) / 1000000 )) ms, $(( M * 1000000000 / (e - s) )) msg/s"
