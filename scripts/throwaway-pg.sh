# Sourced by the scripts that measure on a throwaway PostgreSQL cluster of
# their own (claim-cost.sh, writers-beside-relay.sh), never run alone.
#
# throwaway_pg NAME [SETTING...] creates a cluster in a temporary directory
# named after NAME, starts it on a free loopback port with
# pg_stat_statements loaded and the given settings ("-c name=value" each),
# creates the extension, and sets DB (its postgres database) and dir (the
# directory, where the caller may keep files). The cluster and the
# directory go when the script exits (the server's log is copied to
# $PG_LOG first, when set). q runs one statement on DB; load_backlog
# (below) loads the backlog the drain measurements share.
#
# Needs initdb/pg_ctl (Debian: postgresql); run as root, the server runs as
# the OS user postgres.

_as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

_throwaway_pg_cleanup() {
  if [ -n "${PG_LOG:-}" ]; then cp "$dir/log" "$PG_LOG" 2>/dev/null || true; fi
  _as_pg "$_pg_bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}

q() { psql -q -At "$DB" -c "$1"; }

# load_backlog BIN N [STATEMENT...] gives DB a fresh outbox schema,
# migrated by the relay binary BIN, holding N messages (1,000 keys,
# 200-byte payloads); runs each STATEMENT; then vacuums and analyzes the
# outbox, checkpoints and resets pg_stat_statements, so that what comes
# next is measured alone.
load_backlog() {
  local bin=$1 n=$2 st
  shift 2
  q "DROP SCHEMA IF EXISTS outbox CASCADE" >/dev/null 2>&1
  DATABASE_URL=$DB "$bin" migrate >/dev/null 2>&1
  q "INSERT INTO outbox.messages (topic, key, payload)
     SELECT 'bench', 'key-' || (i % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $n) i" >/dev/null
  for st in "$@"; do q "$st" >/dev/null; done
  q "VACUUM ANALYZE outbox.messages" >/dev/null
  q "CHECKPOINT" >/dev/null
  q "SELECT pg_stat_statements_reset()" >/dev/null
}

throwaway_pg() {
  local name=$1 port
  shift
  _pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
  dir=$(mktemp -d "/tmp/$name.XXXXXX")
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
  trap _throwaway_pg_cleanup EXIT
  _as_pg "$_pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-locale --encoding=UTF8 --no-sync >/dev/null
  _as_pg "$_pg_bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir -c shared_preload_libraries=pg_stat_statements $*" start >/dev/null
  DB=postgres://postgres@127.0.0.1:$port/postgres
  q "CREATE EXTENSION pg_stat_statements" >/dev/null
}
