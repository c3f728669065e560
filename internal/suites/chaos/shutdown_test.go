package chaos

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestStopDuringHeartbeat sends SIGTERM while the relay's lane-lease
// heartbeat is stuck in the database (here: behind a row lock the test
// holds; in production: a slow or overloaded server). The relay must still
// hand its lanes back and unregister before it exits, so that the other
// relays take over at once instead of after the lease TTL (or, with fast
// failover, at their next heartbeat). Found by the chaos test: a SIGTERM
// that arrived during a heartbeat logged "could not release lanes".
func TestStopDuringHeartbeat(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping in -short mode: it runs a relay process")
	}
	pool, schema := pgtest.Schema(t)
	bin := relayBinary(t)
	ctx, cancel := testContext(t)
	defer cancel()
	rc := newReceiver(t)
	c := newCluster(t, bin, pgtest.URL(), schema, relayArgs(rc.url))
	s := migrations.Ident(schema)

	c.start("r1")
	waitLanes(ctx, t, c, map[string]int{"r1.1": 256})

	// The relay's own row, locked by the test: the heartbeat's first
	// statement (the upsert of that row) waits for the lock.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // released below on success
	if tag, err := lock.Exec(ctx, `SELECT 1 FROM `+s+`.relays WHERE id = 'r1.1' FOR UPDATE`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("lock the relay's row: %v (%d rows)", err, tag.RowsAffected())
	}

	waitFor(ctx, t, 10*time.Second, "the relay's heartbeat to wait for the test's lock", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, c.appName).Scan(&n)
		return err == nil && n > 0
	})
	// SIGTERM now; the lock goes once the relay says it is draining
	// (unregistering needs the row too), well within the relay's time for
	// releasing its lanes.
	p := c.proc("r1")
	stopped := make(chan time.Duration, 1)
	go func() { stopped <- c.stop("r1") }()
	waitFor(ctx, t, 30*time.Second, "the relay to log that it is draining", func() bool {
		return len(grepFile(p.logPath, "draining")) > 0
	})
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	took := <-stopped
	t.Logf("relay exited %s after SIGTERM", took.Round(time.Millisecond))

	var lanes, registered int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.lanes WHERE owner = 'r1.1'),
       (SELECT count(*) FROM `+s+`.relays WHERE id = 'r1.1')`).Scan(&lanes, &registered); err != nil {
		t.Fatal(err)
	}
	if lanes != 0 || registered != 0 {
		t.Errorf("after a clean exit, relay r1.1 still owns %d lanes and has %d relays row(s); want 0 and 0 "+
			"(its logs: %q)", lanes, registered, grepFile(c.proc("r1").logPath, "could not"))
	}
}

// TestStopDuringStartUp sends SIGTERM at many points of a relay's start,
// from the moment its run command logs its first line (before it has
// opened its sinks or reached the database): a stop is not a failure, so
// every run exits 0. (Before that line the Go runtime and the packages'
// initialization run, when no program can catch a signal; see
// waitSignalable.)
func TestStopDuringStartUp(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping in -short mode: it runs relay processes")
	}
	_, schema := pgtest.Schema(t)
	bin := relayBinary(t)
	for _, d := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond} {
		r, err := testkit.StartRelay(context.Background(), testkit.RelayConfig{
			Bin:  bin,
			Args: []string{"run", "--sink", "discard", "--schema", schema, "--admin-addr", ""},
			Env:  append(testkit.CleanEnv(), "DATABASE_URL="+pgtest.URL()),
		})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-r.Spoke():
		case <-time.After(30 * time.Second):
			_ = r.Stop()
			t.Fatalf("no log line within 30s")
		}
		// The delay after the first log line is the subject: each run
		// stops the relay at another point of its start.
		time.Sleep(d)
		if err := r.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		<-r.Done()
		if err := r.Err(); err != nil {
			t.Errorf("SIGTERM %s after the first log line: %v (want exit 0)", d, err)
		}
	}
}
