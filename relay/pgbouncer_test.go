package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Relays behind PgBouncer in transaction pooling mode: a throwaway
// pgbouncer of the test's own, with a stock configuration (it refuses
// start-up parameters it does not know), in front of the test database.

// bouncer starts a pgbouncer with poolSize server connections in front of
// the test database and returns its URL for that database.
func bouncer(t *testing.T, poolSize int) string {
	t.Helper()
	return bouncerAs(t, "", poolSize)
}

// bouncerAs is bouncer for user (the test database's when empty).
func bouncerAs(t *testing.T, user string, poolSize int) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	if user == "" {
		user = u.User.Username()
	}
	b := throwaway.PgBouncer(t, net.JoinHostPort(host, port), user, poolSize)
	return b.DatabaseURL(u.Path[1:])
}

// startOn runs a relay whose pool connects to dbURL until the test ends
// (or stop is called; stop reports Run's error).
func (e *env) startOn(dbURL string, cfg relay.Config, sink sinks.Sink) (*relay.Relay, func() error) {
	e.t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: dbURL, Workers: cfg.Workers})
	require.NoError(e.t, err)
	r, err := relay.New(pool, sink, cfg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = errors.New("relay did not stop within 30s")
			}
			pool.Close()
		})
		return runErr
	}
	e.t.Cleanup(func() { require.NoError(e.t, stop()) })
	return r, stop
}

// watcherLockHolders counts the sessions that hold the schema's watcher
// lock (store's watcherLockKey).
func (e *env) watcherLockHolders() int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = x'6f757477'::int::oid AND l.objid = hashtext($1)::oid`, e.schema).Scan(&n))
	return n
}

// TestPgBouncerLeavesNoWatcherLock: a relay that ran through PgBouncer
// leaves no session state on the pooled backends. Before, it took the
// watcher's session lock there, which stayed with an idle pooled backend
// after the relay stopped: every relay afterwards, direct ones too,
// followed a watcher that did not exist, and new rows waited for the
// workers' slow poll. Here the relays' workers never poll (an hour):
// only a watcher wakes them.
func TestPgBouncerLeavesNoWatcherLock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dbURL := bouncer(t, 2)

	h := &wakeHooks{}
	sink := memory.New()
	_, stop := e.startOn(dbURL, idleConfig(e, relay.WakeupAuto, h), sink)
	waitSource(t, h, "poll")
	e.write(msg("t", "a", "1"), msg("t", "b", "2"))
	require.NoError(t, sink.WaitFor(waitCtx(t, wakeBound), 2), "the pooled relay finds new rows itself")
	require.Zero(t, e.watcherLockHolders(), "no session holds the watcher lock while only a pooled relay runs")
	require.NoError(t, stop())
	require.Zero(t, e.watcherLockHolders(), "the stopped relay left the watcher lock on a pooled backend")

	// A direct relay is the watcher at once and wakes on new rows.
	h2 := &wakeHooks{}
	sink2 := memory.New()
	e.start(idleConfig(e, relay.WakeupAuto, h2), sink2)
	waitSource(t, h2, "poll")
	e.write(msg("t", "c", "3"))
	require.NoError(t, sink2.WaitFor(waitCtx(t, wakeBound), 1))
}

// TestPgBouncerRelaysDeliverOnce: two relays through a stock PgBouncer
// with two server connections, from a plain URL, beside a direct one.
// Before, the pool's start-up parameters were refused (08P01, retried as
// "database not reachable yet" until the connect timeout), and with them
// allowed, pgx's cached prepared statements met other clients' backends
// (42P05, 26000) and settled batches were delivered again.
func TestPgBouncerRelaysDeliverOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dbURL := bouncer(t, 2)
	const n = 3000
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%97), fmt.Sprint(i)))
	}
	sink := memory.New()
	cfg := e.config()
	cfg.PollInterval = time.Hour
	e.startOn(dbURL, cfg, sink)
	e.startOn(dbURL, cfg, sink)
	e.start(cfg, sink)
	for i := 0; i < n; i += 500 {
		e.write(msgs[i : i+500]...)
	}
	require.NoError(t, sink.WaitFor(waitCtx(t, time.Minute), n))
	got := sink.Delivered()
	require.Len(t, got, n, "no message delivered twice (no relay crashed)")
	checkOrder(t, got)
	require.Empty(t, sink.Violations())
	// The sink holds the last batch before its relay has settled it.
	eventually(t, 30*time.Second, func() bool { return e.count("messages") == 0 }, "%d messages left in the outbox", e.count("messages"))
	require.Equal(t, 1, e.watcherLockHolders(), "only the direct relay holds the watcher lock")
}

// TestPgBouncerRefusesPreparedStatements: an embedder's own pool that
// caches prepared statements (pgx's default) is refused at start through
// a pooler, saying what to change, instead of settling batches twice.
func TestPgBouncerRefusesPreparedStatements(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dbURL := bouncer(t, 2)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := relay.New(pool, memory.New(), e.config())
	require.NoError(t, err)
	err = r.Run(waitCtx(t, 30*time.Second))
	require.ErrorIs(t, err, relay.ErrConfig)
	require.ErrorContains(t, err, "default_query_exec_mode=exec")
}
