package faults

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// TestBackendsTerminatedMidBatch kills every database session of one relay
// (pg_terminate_backend on the sessions carrying its application_name:
// claim workers, lane lease, LISTEN) again and again while it drains, with
// a sink slow enough that the kills land inside claim transactions. The
// relay must reconnect by itself, lose nothing and redeliver at most the
// batches that were in flight when their sessions died (two per worker:
// the sink's delay makes it the bound, so each worker pipelines).
func TestBackendsTerminatedMidBatch(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()

	const (
		n       = 6000
		workers = 2
		batch   = 100
	)
	want := commit(t, pool, schema, messages("orders", keyNames("k", 50), 0, n, nil))

	appName := testkit.RandName("faults_term_")
	sink := memory.New()
	// Most of a worker's time is spent inside its claim transaction,
	// waiting for the sink: that is where the kills should land.
	sink.SetDelay(40 * time.Millisecond)
	p := runInproc(t, dbURL(t, "", "application_name", appName), schema, sink, relay.Config{
		Workers: workers, BatchSize: batch, MaxAttempts: 3,
	})

	// Kill rounds until at least 4 rounds caught a session inside a
	// transaction (mid-batch), or the backlog is gone. Each round waits
	// until a relay session is inside a transaction again (it reconnected
	// and claimed), then terminates every session of the relay.
	rounds, midBatch, killed := 0, 0, 0
	deadline := time.Now().Add(60 * time.Second)
	inTx := func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND xact_start IS NOT NULL AND state IN ('active', 'idle in transaction')`, appName).Scan(&n)
		return n > 0
	}
	for midBatch < 4 && time.Now().Before(deadline) {
		round, cancelRound := context.WithTimeout(ctx, 10*time.Second)
		testkit.Poll(round, 10*time.Millisecond, func() bool { return inTx() || count(t, pool, schema, "messages") == 0 })
		cancelRound()
		if count(t, pool, schema, "messages") == 0 {
			break
		}
		var k, inTx int
		require.NoError(t, pool.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE in_tx)
FROM (SELECT pg_terminate_backend(pid) AS ok, state IN ('active', 'idle in transaction') AND xact_start IS NOT NULL AS in_tx
      FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()) s WHERE ok`, appName).Scan(&k, &inTx))
		rounds++
		killed += k
		if inTx > 0 {
			midBatch++
		}
	}
	require.GreaterOrEqual(t, midBatch, 4, "kills that landed mid-batch (the backlog drained too fast?)")

	// The relay must come back by itself and finish.
	eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, "messages still pending: " + itoa(left) + "\nrelay logs:\n" + p.logs.tail(10)
	})
	got := fromMemory(sink.Delivered())
	dups := checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Empty(t, sink.Violations(), "a key was sent by two workers at once")
	require.Empty(t, deadLetters(t, pool, schema), "a terminated session must not count as a failed delivery")

	// A kill can roll back at most the batches each worker had in flight.
	bound := rounds * workers * relay.DefaultPipeline * batch
	require.LessOrEqual(t, dups, bound, "redeliveries")
	st := p.r.Stats()
	var sessions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&sessions))
	t.Logf("%d messages; %d kill rounds (%d landed mid-batch), %d sessions terminated; "+
		"%d redeliveries (bound %d = rounds x workers x batch); settle failures %d; relay sessions now %d",
		n, rounds, midBatch, killed, dups, bound, st.CommitFailures, sessions)
	require.Positive(t, sessions, "the relay reconnected")
}
