package store

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestTxSettingsThroughPgBouncer: behind PgBouncer in transaction mode
// the claim's transaction still runs with the relay's timeouts, set in
// the transaction (session settings are refused as start-up parameters,
// or dropped: a relay frozen mid-batch then held its rows and lanes until
// it woke). Pooled sees the proxy, and a direct session as its own.
func TestTxSettingsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	b := throwaway.PgBouncer(t, net.JoinHostPort(u.Hostname(), port), u.User.Username(), 1)
	for url, pooled := range map[string]bool{b.DatabaseURL(u.Path[1:]): true, pgtest.URL(): false} {
		cfg, err := pgx.ParseConfig(url)
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		c, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		got, err := Pooled(ctx, c)
		require.NoError(t, err)
		require.Equal(t, pooled, got, url)

		s := TxSettings{IdleInTransaction: 90 * time.Second, Statement: time.Minute, Lock: 30 * time.Second}
		b := &pgx.Batch{}
		b.Queue(Begin)
		b.Queue(s.SQL())
		var idle, stmt, lock, iso string
		b.Queue(`SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout'),
       current_setting('lock_timeout'), current_setting('transaction_isolation')`).QueryRow(func(r pgx.Row) error {
			return r.Scan(&idle, &stmt, &lock, &iso)
		})
		b.Queue("COMMIT")
		require.NoError(t, c.SendBatch(ctx, b).Close())
		require.Equal(t, []string{"90s", "1min", "30s", "read committed"}, []string{idle, stmt, lock, iso}, url)
		require.NoError(t, c.Close(ctx))
	}
}
