package faults

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// closedAMQP returns an AMQP URL whose port refuses connections: a sink
// that can never connect.
func closedAMQP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "amqp://guest:guest@" + addr + "/?exchange=orders"
}

// startStuckRelay starts the binary against an AMQP sink that refuses
// connections, with a backlog, and returns once a worker holds a batch
// (a claim transaction open while the sink waits for its connection).
func startStuckRelay(t *testing.T, drain time.Duration) (*relayProc, func() int) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	bulkInsert(t, pool, schema, "orders", 200)
	app := testkit.RandName("faults_stop_")
	p := startRelay(t, dbURL(t, "", "application_name", app), schema, "--sink", closedAMQP(t),
		"--drain-timeout", drain.String(), "--publish-timeout", "60s", "--log-format", "json")
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			// The claim's transaction (its last statement the claim, in its
			// plain or priority form: pg_stat_activity keeps the first
			// 1 kB of a statement), not another of the relay's (a
			// heartbeat's, between its round trips), held for a while: a
			// claim that found nothing (before the relay had lanes) sits
			// idle in transaction for a moment too, until its COMMIT.
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'
			 AND (query LIKE '%c.message_id, c.topic%' OR query LIKE '%WITH pl AS MATERIALIZED%')
			 AND state_change < clock_timestamp() - interval '500 milliseconds'`, app).Scan(&n))
		if n > 0 {
			return true, ""
		}
		return false, "no claim transaction open yet; the relay's sessions:\n" + sessions(t, pool, app) + "\n" + p.logs.tail(10)
	})
	return p, func() int { return count(t, pool, schema, "messages") }
}

// Issue 34: SIGTERM stops a relay whose sink cannot connect within the
// drain timeout: the batch waiting for the sink is rolled back when the
// drain timeout ends, and the sink's close does not hold the exit. The
// bound asserted is the drain timeout plus 5 s, generous on purpose: it
// checks a promise about a bound (the sink's 60 s publish timeout, or its
// reconnect loop, would exceed it by far), not a speed.
func TestStopWithUnreachableSinkIsBounded(t *testing.T) {
	t.Parallel()
	const drain = 3 * time.Second
	p, left := startStuckRelay(t, drain)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(drain+5*time.Second), "a graceful stop exits 0")
	require.Equal(t, 200, left(), "every message is still in the outbox")
}

// Issue 34: a second signal exits at once, long before the drain timeout
// (60 s here), and loses nothing: the open claim rolls back with its
// connection and the rows stay.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	p, left := startStuckRelay(t, time.Minute)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		return p.logs.Count("draining: no new claims") > 0, "no drain yet:\n" + p.logs.tail(10)
	})
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.Equal(t, 1, p.wait(10*time.Second), "the second signal exits 1, without waiting for the 1 min drain")
	require.Contains(t, p.logs.String(), "second terminated: exiting at once")
	require.Equal(t, 200, left(), "every message is still in the outbox")
}

// sessions lists the database sessions of application app (state, wait
// and the start of the last statement), to say where a relay waits.
func sessions(t *testing.T, pool *pgxpool.Pool, app string) string {
	rows, err := pool.Query(context.Background(),
		`SELECT coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, ''), left(regexp_replace(coalesce(query, ''), '\s+', ' ', 'g'), 90)
		 FROM pg_stat_activity WHERE application_name = $1 ORDER BY backend_start`, app)
	require.NoError(t, err)
	var b strings.Builder
	for rows.Next() {
		var state, wait, query string
		require.NoError(t, rows.Scan(&state, &wait, &query))
		fmt.Fprintf(&b, "  %s [%s] %s\n", state, wait, query)
	}
	require.NoError(t, rows.Err())
	if b.Len() == 0 {
		return "  (none)"
	}
	return b.String()
}
