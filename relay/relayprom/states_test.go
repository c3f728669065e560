package relayprom_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
)

// retrying_messages counts the messages that failed (as `status` does), a
// message written with a delivery time to come is delayed, not retrying.
func TestBacklogGaugesCountEachState(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+migrations.Ident(schema)+`.messages (topic, payload, available_at, attempts) VALUES
    ('t', 'ready', NULL, 0),
    ('t', 'failed, waiting', now() + interval '1 hour', 1),
    ('t', 'failed, due', now() - interval '1 second', 2),
    ('t', 'delayed', now() + interval '1 hour', 0)`)
	require.NoError(t, err)
	reg := watchOutbox(t, pool, schema)
	// The gauges are set one after the other, delayed after pending and
	// retrying.
	eventually(t, func() bool { return value(t, reg, "outbox_relay_delayed_messages", nil) == 1 }, "delayed gauge never set")
	require.Equal(t, 4.0, value(t, reg, "outbox_relay_pending_messages", nil))
	require.Equal(t, 2.0, value(t, reg, "outbox_relay_retrying_messages", nil))
	require.Equal(t, 1.0, value(t, reg, "outbox_relay_delayed_messages", nil))
}

// watchOutbox runs the backlog check every 20ms until the test ends and
// returns the registry of its gauges.
func watchOutbox(t *testing.T, pool *pgxpool.Pool, schema string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	m := relayprom.New(reg, "test")
	m.Hooks("", "memory")
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.WatchOutbox(ctx, pool, schema, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() { stop(); <-done })
	return reg
}
