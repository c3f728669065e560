package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// TestPostgresRestart restarts PostgreSQL under a relay in the
// middle of a drain, then stops it for a few seconds and starts it again.
// The relay must reconnect with backoff, lose nothing, and not spin while
// the database is down (CPU time and reconnect attempts are measured).
// The server is a throwaway one of the test's own (pgtest.Server): the
// shared server is never restarted.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.Server(t)
	pool, schema := srv.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()

	const n = 40_000
	want := commit(t, pool, schema, messages("orders", keyNames("k", 100), 0, n, nil))
	rc := newReceiver(t, nil)
	p := startRelay(t, srv.URL(), schema, "--sink", rc.url(), "--batch-size", "200")
	eventually(t, 30*time.Second, 5*time.Millisecond, func() (bool, string) {
		return distinct(rc.deliveries()) >= 2000, "first deliveries"
	})

	// 1. A plain restart in the middle of the drain.
	before := distinct(rc.deliveries())
	start := time.Now()
	require.NoError(t, srv.Restart(ctx)) // returns once the server accepts connections
	restartTook := time.Since(start)
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		return distinct(rc.deliveries()) > before+1000, "the relay did not resume after the restart:\n" + p.logs.tail(5)
	})
	resumed := time.Since(start)

	// 2. Down for a while: the relay must wait with backoff, not spin.
	require.Less(t, distinct(rc.deliveries()), n, "the drain finished before the second fault")
	down := 6 * time.Second
	require.NoError(t, srv.Stop(ctx))
	stoppedAt := time.Now()
	logsBefore := len(p.logLines())
	cpu0, err := p.cpuTime()
	require.NoError(t, err)
	// The window is the subject: CPU time and log lines per second of a
	// database that stays away show whether the relay backs off or spins.
	// Nothing the relay announces marks "long enough"; 6s covers several
	// steps of its connection backoff.
	time.Sleep(down)
	cpu1, err := p.cpuTime()
	require.NoError(t, err)
	lines := p.logLines()[logsBefore:]
	require.NoError(t, srv.Start(ctx))
	startedAt := time.Now()
	attempts := map[string]int{}
	for _, l := range lines {
		if l["level"] == "WARN" || l["level"] == "ERROR" {
			attempts[fmt.Sprint(l["msg"])]++
		}
	}
	total := 0
	for _, c := range attempts {
		total += c
	}

	// Looked at twice a second: distinct over 40,000 deliveries every
	// 50 ms competes for the CPU with the relay and the receiver (in this
	// process). The window is wide because on a loaded 2-core machine the
	// drain after the restart took more than 2 minutes, at about 100
	// msg/s, with the relay waiting on the receiver (a goroutine dump);
	// a relay that stops draining still fails it.
	eventually(t, 240*time.Second, 500*time.Millisecond, func() (bool, string) {
		left := -1
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM "+quoted(schema)+".messages").Scan(&left)
		return left == 0 && distinct(rc.deliveries()) >= n, fmt.Sprintf("%d pending, %d of %d delivered", left, distinct(rc.deliveries()), n)
	})
	recovered := time.Since(startedAt)
	got := rc.deliveries()
	dups := checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema))
	cpu := cpu1 - cpu0
	t.Logf("restart took %s, deliveries resumed %s after it began; then down %s: relay used %s CPU (%.1f%% of one core), "+
		"logged %d failed attempts (%v); drain finished %s after the server was back; %d messages, %d redelivered",
		restartTook.Round(time.Millisecond), resumed.Round(time.Millisecond), startedAt.Sub(stoppedAt).Round(time.Millisecond),
		cpu, 100*cpu.Seconds()/down.Seconds(), total, attempts, recovered.Round(time.Millisecond), n, dups)
	require.Less(t, cpu, down/10, "the relay must not spin while the database is down")
	// Four reconnect loops (2 workers, lane lease, LISTEN) with backoff
	// from 100ms growing x1.5 to 5s make about 9 attempts each in 6s.
	require.Less(t, total, 80, "reconnect attempts while the database was down")
}

func quoted(schema string) string { return pgx.Identifier{schema}.Sanitize() }
