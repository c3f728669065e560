package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// testRole creates a login role for this test (roles are global to the
// server, so the name is random) and drops it, with its privileges, when
// the test ends.
func testRole(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	role := prefix + testkit.RandName("_")
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE ROLE "+migrations.Ident(role)+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		terminateRole(t, pool, role)
		for _, q := range []string{"DROP OWNED BY " + migrations.Ident(role), "DROP ROLE " + migrations.Ident(role)} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	return role
}

// terminateRole ends every session of role and returns how many there were.
func terminateRole(t testing.TB, pool *pgxpool.Pool, role string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1) s`, role).Scan(&n))
	return n
}

// TestReadOnlyDatabase makes the relay's database read-only under it (what
// a failover to a replica, or a disk-full protection, looks like): the
// relay connects as a dedicated role whose default_transaction_read_only
// is switched on, and its sessions are terminated so that new ones pick
// the setting up. Nothing may be lost or dead-lettered, the error must say
// what is wrong, and delivery must resume once the database is writable.
// It runs on the shared server: it changes only the setting of a role of
// its own and ends only that role's sessions; the server and every other
// role stay as they were.
func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	role := testRole(t, pool, "faults_ro")
	s, r := migrations.Ident(schema), migrations.Ident(role)
	for _, q := range []string{
		"GRANT USAGE ON SCHEMA " + s + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + s + " TO " + r,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	rc := newReceiver(t, nil)
	p := startRelay(t, dbURL(t, role), schema, "--sink", rc.url(), "--metrics-interval", "200ms")
	want := commit(t, pool, schema, messages("orders", keyNames("k", 10), 0, 50, nil))
	// Delivered and settled: the receiver has them all and the last batch
	// has committed (otherwise the termination below may land in its
	// settle, and those messages stay pending, to be delivered again).
	eventually(t, 20*time.Second, 20*time.Millisecond, func() (bool, string) {
		return distinct(rc.deliveries()) == 50 && count(t, pool, schema, "messages") == 0, "first messages not delivered"
	})

	_, err := pool.Exec(ctx, "ALTER ROLE "+r+" SET default_transaction_read_only = on")
	require.NoError(t, err)
	killed := terminateRole(t, pool, role)
	roAt := time.Now()
	want = append(want, commit(t, pool, schema, messages("orders", keyNames("k", 10), 50, 200, nil))...)

	const readOnly = "read-only transaction"
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		return p.logs.Count(readOnly) >= 3, "the relay did not log the read-only error:\n" + p.logs.tail(5)
	})
	// Let it try a few more times: three more read-only errors logged.
	tries := p.logs.Count(readOnly)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		return p.logs.Count(readOnly) >= tries+3, "the relay did not try again:\n" + p.logs.tail(5)
	})
	require.Equal(t, 50, distinct(rc.deliveries()), "nothing can be delivered while the relay cannot record it")
	require.Equal(t, 200, count(t, pool, schema, "messages"), "nothing is lost")
	require.Empty(t, deadLetters(t, pool, schema), "nothing is dead-lettered")
	var sample string
	for _, l := range p.logLines() {
		if e, _ := l["error"].(string); strings.Contains(e, readOnly) {
			sample = fmt.Sprintf("level=%v msg=%q error=%q", l["level"], l["msg"], e)
			break
		}
	}
	readyCode, readyBody, err := p.get("/readyz")
	require.NoError(t, err)
	settleFailures, _ := p.metric("outbox_relay_settle_failures_total")
	publishErrors, _ := p.metric("outbox_relay_publish_errors_total")
	errorLines := p.logs.Count(readOnly)
	roFor := time.Since(roAt)

	// Writable again. Existing sessions keep the read-only default they
	// started with, so first see whether the relay recovers without help.
	_, err = pool.Exec(ctx, "ALTER ROLE "+r+" RESET default_transaction_read_only")
	require.NoError(t, err)
	resetAt := time.Now()
	// Five seconds for the relay to recover alone, else it is helped.
	alone, cancelAlone := context.WithTimeout(ctx, 5*time.Second)
	recoveredAlone := testkit.Poll(alone, 100*time.Millisecond, func() bool {
		return count(t, pool, schema, "messages") == 0
	})
	cancelAlone()
	how := "by itself"
	if !recoveredAlone {
		how = fmt.Sprintf("only after its %d sessions were terminated", terminateRole(t, pool, role))
	}
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d still pending after the database became writable again:\n%s", left, p.logs.tail(5))
	})
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema))
	require.NotEqual(t, 200, readyCode, "/readyz must not report ready while every claim fails")
	require.True(t, recoveredAlone, "the relay must recover by itself once the database is writable again")
	t.Logf("read-only for %s (%d sessions terminated): %d error lines, e.g. %s; /readyz answered %d %q; "+
		"settle_failures_total %v, publish_errors_total %v; after RESET the relay recovered %s, %s after the reset; 250 of 250 delivered",
		roFor.Round(time.Millisecond), killed, errorLines, sample, readyCode, strings.TrimSpace(readyBody),
		settleFailures, publishErrors, how, time.Since(resetAt).Round(time.Millisecond))
}
