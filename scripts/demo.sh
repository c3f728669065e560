#!/usr/bin/env bash
# make demo: migrate, start the relay with the stdout sink, let a small app
# place orders in transactions (every third one rolls back), and show the
# events arriving. Events go to stdout; logs and the app's narration to
# stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:=postgres://postgres@127.0.0.1:5432/test}"
export DATABASE_URL

bin/outbox-relay migrate
echo "--- relay started; events appear below as JSON lines ---" >&2
bin/outbox-relay run --sink stdout --log-level warn &
relay=$!
trap 'kill -TERM $relay 2>/dev/null || true' EXIT
bin/outbox-demo --orders 6 --every 300ms
# Wait until the relay has published everything, then stop it cleanly.
for _ in $(seq 1 100); do
	pending=$(bin/outbox-relay status --json | sed -n 's/^  "pending": \([0-9]*\),$/\1/p')
	[ "$pending" = 0 ] && break
	sleep 0.1
done
kill -TERM $relay
wait $relay
trap - EXIT
echo "--- relay drained and stopped; rolled-back orders produced no event ---" >&2
bin/outbox-relay status >&2
