package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Issue 35, finding 7: with --wakeup wal, every large transaction of the
// database, on unrelated tables too, was decoded into the relay's slot and
// spilled to pg_replslot once over logical_decoding_work_mem (600k rows:
// 637 MB on the server's disk). Where the server can stream in-progress
// transactions (PostgreSQL 14+), the relay asks for it: the server sends a
// large transaction's changes as they come instead of keeping them until
// its commit, and pgoutput drops those of unpublished tables. The slot's
// own counters (pg_stat_replication_slots) say what was spilled.
// walRelay is a relay following the WAL of a throwaway cluster of its
// own (wal_level = logical), into a memory sink, with no polling that
// could explain a wake-up.
type walRelay struct {
	*env
	h    *wakeHooks
	r    *relay.Relay
	stop func()
}

// startWALRelay starts the cluster (with conf besides what the WAL
// needs), migrates a schema on it and starts the relay; it returns once
// the relay follows the WAL.
func startWALRelay(t *testing.T, conf ...string) *walRelay {
	t.Helper()
	srv := pgtest.ServerConf(t, append([]string{"wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4"}, conf...)...)
	pool, schema := srv.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	e := &env{t: t, pool: pool, schema: schema, w: w, sink: memory.New()}
	h := &wakeHooks{}
	cfg := idleConfig(e, relay.WakeupWAL, h)
	cfg.WatchInterval = time.Hour
	r, stop := startOn(t, srv.URL(), cfg, e.sink)
	waitSource(t, h, "wal")
	return &walRelay{env: e, h: h, r: r, stop: stop}
}

func TestWakeupWALDoesNotSpillLargeTransactions(t *testing.T) {
	t.Parallel()
	wr := startWALRelay(t, "logical_decoding_work_mem = 64kB")
	e, pool, r := wr.env, wr.pool, wr.r
	ctx := context.Background()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 140000 {
		t.Skipf("PostgreSQL %d cannot stream in-progress transactions (14+ can): large transactions spill", version)
	}
	var slot string
	eventually(t, wakeBound, func() bool {
		return pool.QueryRow(ctx, "SELECT slot_name FROM pg_replication_slots WHERE temporary").Scan(&slot) == nil
	}, "the relay's slot")
	e.deliveredWithin(r, e.sink, 1, "k")

	// An unrelated transaction of 200k rows (about 20 MB decoded), with an
	// outbox message written while it runs: the relay is woken for the
	// message at its commit, not after the big one's.
	_, err := pool.Exec(ctx, "CREATE TABLE unrelated (id int, pad text)")
	require.NoError(t, err)
	big, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer big.Rollback(ctx) //nolint:errcheck
	_, err = big.Exec(ctx, "INSERT INTO unrelated SELECT i, repeat('x', 60) FROM generate_series(1, 100000) i")
	require.NoError(t, err)
	e.write(msg("wake", "k", "during the big transaction"))
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 2 }, "the message committed while the big transaction runs")
	_, err = big.Exec(ctx, "INSERT INTO unrelated SELECT i, repeat('x', 60) FROM generate_series(100001, 200000) i")
	require.NoError(t, err)
	require.NoError(t, big.Commit(ctx))
	e.write(msg("wake", "k", "after the big transaction"))
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 3 }, "the message committed after the big transaction")

	var spillBytes, streamBytes, totalBytes int64
	eventually(t, wakeBound, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT spill_bytes, stream_bytes, total_bytes FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).
			Scan(&spillBytes, &streamBytes, &totalBytes))
		return spillBytes+streamBytes > 10<<20
	}, "the slot's counters show the big transaction decoded (spilled or streamed)")
	t.Logf("slot %s: spill_bytes %d, stream_bytes %d, total_bytes %d", slot, spillBytes, streamBytes, totalBytes)
	require.Less(t, spillBytes, int64(1<<20), "a large transaction is streamed, not spilled to pg_replslot")

	// A large transaction of the outbox's own is streamed too: its Stream
	// Commit wakes the relay (nothing else would: no poll within the test).
	var streamTxns int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).Scan(&streamTxns))
	const n = 3000
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg("wake", fmt.Sprintf("bulk-%d", i%50), strings.Repeat("p", 200))
	}
	e.write(msgs...)
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 3+n }, "the messages of a streamed outbox transaction")
	var after int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).Scan(&after))
	require.Greater(t, after, streamTxns, "the outbox's transaction was streamed (it is over logical_decoding_work_mem)")

	if version >= 150000 {
		// The stream is a wake-up: it carries the id and the key (the
		// lane), not the payload.
		var cols []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT attnames::text[] FROM pg_publication_tables WHERE pubname = $1`, migrations.Publication(e.schema)).Scan(&cols))
		require.Equal(t, []string{"id", "key"}, cols, "the publication's column list")
	}
}

// A relay alone following the WAL wakes the lane of each reported row
// straight from the stream and claims it without a look for it: its
// workers tell the watcher which rows they claimed, and only a row no
// claim returned within a few milliseconds (one claimed before the
// writer's transaction was visible) is looked for.
func TestWakeupWALClaimsReportedRowsWithoutALook(t *testing.T) {
	t.Parallel()
	wr := startWALRelay(t)
	e, r := wr.env, wr.r
	e.deliveredWithin(r, e.sink, 1, "k1")
	awaitNext(t, r, relay.SigWatcherIdle)
	looks, missed := r.SignalCount(relay.SigFoundRows), r.SignalCount(relay.SigWALMissed)
	const n = 8
	for i := 2; i <= n+1; i++ {
		e.deliveredWithin(r, e.sink, i, fmt.Sprint("k", i))
	}
	awaitNext(t, r, relay.SigWatcherIdle)
	looks, missed = r.SignalCount(relay.SigFoundRows)-looks, r.SignalCount(relay.SigWALMissed)-missed
	t.Logf("%d messages written one at a time: %d looks found rows, %d rows not claimed in time", n, looks, missed)
	require.Less(t, missed, n, "rows woken straight from the stream and claimed (the workers tell the watcher)")
	if missed == 0 {
		require.Zero(t, looks, "looks for rows the claims returned")
	}
}

// A publication made by an earlier migrate carries every column, or the
// id alone: the next migrate gives it the column list (id, key) where the
// server has column lists (15+), so that payloads leave the stream and
// the key (the row's lane) is in it.
func TestMigrateGivesThePublicationItsColumnList(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerConf(t, "wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4")
	pool, schema := srv.Schema(t)
	ctx := context.Background()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 150000 {
		t.Skipf("PostgreSQL %d has no publication column lists (15+ has)", version)
	}
	pub := migrations.Ident(migrations.Publication(schema))
	_, err := pool.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+migrations.Ident(schema)+".messages")
	require.NoError(t, err)
	columns := func() []string {
		var cols []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT attnames::text[] FROM pg_publication_tables WHERE pubname = $1`, migrations.Publication(schema)).Scan(&cols))
		return cols
	}
	require.Contains(t, columns(), "payload", "the publication of an earlier release")
	_, err = migrations.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []string{"id", "key"}, columns())

	_, err = pool.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+migrations.Ident(schema)+".messages (id)")
	require.NoError(t, err)
	_, err = migrations.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []string{"id", "key"}, columns(), "the publication of release 0.1.0")
}
