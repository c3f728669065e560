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

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
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

// A route with on-dead-letter hold: its held keys and the age of its
// oldest hold, per route; the series goes when nothing is held. Parked
// rows (held dead letters) are not pending.
func TestHeldKeysGauges(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (id, topic, key, payload, available_at, attempts, held_since, held_route) VALUES
    (1, 't', 'a', 'dead', 'infinity', 1, now() - interval '1 hour', 'orders'),
    (2, 't', 'b', 'dead', 'infinity', 1, now(), 'orders'),
    (3, 't', 'a', 'held', NULL, 0, NULL, NULL);
INSERT INTO `+s+`.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason)
SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent' FROM `+s+`.messages WHERE held_since IS NOT NULL`)
	require.NoError(t, err)
	reg := watchOutbox(t, pool, schema)
	eventually(t, func() bool { return has(t, reg, "outbox_relay_held_keys") }, "held_keys never set")
	require.Equal(t, 2.0, value(t, reg, "outbox_relay_held_keys", map[string]string{"route": "orders"}))
	require.GreaterOrEqual(t, value(t, reg, "outbox_relay_oldest_hold_age_seconds", map[string]string{"route": "orders"}), 3600.0)
	require.Equal(t, 1.0, value(t, reg, "outbox_relay_pending_messages", nil), "parked rows are dead letters, not pending")
	require.Equal(t, 0.0, value(t, reg, "outbox_relay_retrying_messages", nil))

	// Purged: the trigger of migration 010 releases the keys.
	_, err = pool.Exec(ctx, `DELETE FROM `+s+`.dead_letters`)
	require.NoError(t, err)
	eventually(t, func() bool { return !has(t, reg, "outbox_relay_held_keys") }, "held_keys series not deleted")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.messages`).Scan(&left))
	require.Equal(t, 1, left, "the parked rows went with their dead letters")
}

func has(t *testing.T, reg *prometheus.Registry, name string) bool {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 {
			return true
		}
	}
	return false
}
