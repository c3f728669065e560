package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Settings a DBA may give the database or the role, which the relay's
// sessions override: idle_session_timeout (the relay's LISTEN and lease
// sessions are idle by design; it cut them every few seconds: heartbeat
// failures 57P05, lane rebalances, LISTEN reconnects), serializable as
// the default isolation (heartbeats failed with serialization errors),
// a tiny statement_timeout. Set on a role of the test's own (roles are
// the cluster's: it is dropped at the end), not on the shared server.

// dbaRole creates a superuser role with the settings a DBA might give it
// and returns the test database's URL for it.
func (e *env) dbaRole() (role, dbURL string) {
	e.t.Helper()
	role = "dba_" + e.schema[len(e.schema)-8:]
	e.exec(fmt.Sprintf(`CREATE ROLE %s LOGIN SUPERUSER`, role))
	e.t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = e.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	for _, set := range []string{"idle_session_timeout = '100ms'", "default_transaction_isolation = 'serializable'", "statement_timeout = '5s'"} {
		e.exec(fmt.Sprintf("ALTER ROLE %s SET %s", role, set))
	}
	u, err := url.Parse(pgtest.URL())
	require.NoError(e.t, err)
	u.User = url.User(role)
	return role, u.String()
}

// logCounter counts the log records whose text holds any of some
// SQLSTATEs.
type logCounter struct {
	slog.Handler
	mu    sync.Mutex
	codes []string
	n     int
	first string
}

func (c *logCounter) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.Value.String()); return true })
	for _, code := range c.codes {
		if strings.Contains(b.String(), code) {
			c.mu.Lock()
			if c.n == 0 {
				c.first = b.String()
			}
			c.n++
			c.mu.Unlock()
		}
	}
	return c.Handler.Handle(ctx, r)
}

func (c *logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCounter{Handler: c.Handler.WithAttrs(as), codes: c.codes}
}

// TestSessionSettingsOverrideDBADefaults: the relay's own sessions run
// without idle_session_timeout, in read committed, with its statement
// timeout, whatever the role's defaults; relays of such a role deliver
// everything without one of the errors those defaults caused.
func TestSessionSettingsOverrideDBADefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, dbURL := e.dbaRole()
	ctx := context.Background()
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: dbURL})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for setting, want := range map[string]string{
		"idle_session_timeout": "0", "default_transaction_isolation": "read committed", "statement_timeout": "1min",
	} {
		var got string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}

	counter := &logCounter{Handler: testLogger(t).Handler(), codes: []string{"57P05", "40001", "57014"}}
	cfg := e.config()
	cfg.Logger = slog.New(counter)
	sink := memory.New()
	e.startOn(dbURL, cfg, sink)
	e.startOn(dbURL, cfg, sink)
	const n = 400
	for i := range n / 100 {
		var msgs []outbox.Message
		for j := range 100 {
			msgs = append(msgs, msg("t", fmt.Sprintf("k%d", j%13), fmt.Sprint(i*100+j)))
		}
		e.write(msgs...)
		require.NoError(t, sink.WaitFor(waitCtx(t, wakeBound), (i+1)*100))
	}
	checkOrder(t, sink.Delivered())
	counter.mu.Lock()
	defer counter.mu.Unlock()
	require.Zero(t, counter.n, "errors the role's defaults cause, the first: %s", counter.first)
}

// TestWakeAfterIdentityReset: after TRUNCATE … RESTART IDENTITY new rows
// take ids below those the polling watcher has seen. It looked for ids
// past the newest it saw, so every later row waited for the workers' slow
// poll (here an hour) until the ids passed the old ones or the relay
// restarted.
func TestWakeAfterIdentityReset(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := &wakeHooks{}
	sink := memory.New()
	e.start(idleConfig(e, relay.WakeupPoll, h), sink)
	waitSource(t, h, "poll")
	for i := range 30 {
		e.write(msg("t", fmt.Sprintf("k%d", i), "before"))
	}
	require.NoError(t, sink.WaitFor(waitCtx(t, wakeBound), 30))
	e.exec("TRUNCATE " + e.table("messages") + " RESTART IDENTITY")
	e.write(msg("t", "k0", "after"))
	require.NoError(t, sink.WaitFor(waitCtx(t, wakeBound), 31), "a row written after the reset is found")
}
