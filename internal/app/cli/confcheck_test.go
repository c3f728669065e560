package cli_test

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
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// startWebhookRelay runs, until the test ends, an embedded relay of the
// default route whose sink stands for a webhook, and waits until it holds
// every lane.
func startWebhookRelay(t *testing.T, schema string, sink *memory.Sink, batchSize int) *relay.Relay {
	t.Helper()
	cfg := relay.Config{Schema: schema, Destination: "https://hooks.example/orders", PollInterval: 20 * time.Millisecond,
		LeaseTTL: 3 * time.Second, Heartbeat: 200 * time.Millisecond, BatchSize: batchSize}
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: relay.DefaultWorkers})
	require.NoError(t, err)
	r, err := relay.New(pool, sink, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		pool.Close()
	})
	testkit.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return r.OwnedLanes() == 256, fmt.Sprintf("the webhook relay holds %d lanes", r.OwnedLanes())
	})
	return r
}

func writeOrders(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, n int) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Sprintf("k%d", i%10), Payload: []byte(fmt.Sprint(i))})
	}
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))
}

// Issue 34: `run --sink stdout` beside a relay of the same route that
// delivers to a webhook takes none of its lanes: it exits 2 naming both
// configurations, and everything written goes to the webhook.
func TestRunRefusesARouteThatRunsAnotherSink(t *testing.T) {
	pool, schema, w := e2e(t)
	hook := memory.New()
	startWebhookRelay(t, schema, hook, 0)
	const n = 200
	writeOrders(t, pool, w, n)

	code, out, stderr := run(t, "run", "--sink", "stdout")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "live relays of the route run another configuration")
	require.Contains(t, stderr, "This relay: sink stdout")
	require.Contains(t, stderr, "sink https://hooks.example/orders")
	require.Contains(t, stderr, "--allow-config-change")
	require.Empty(t, out, "the stdout sink printed no message")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, hook.WaitFor(ctx, n))
}

// With --allow-config-change it takes part, and says that two
// configurations share the route.
func TestRunAllowConfigChangeSharesTheRoute(t *testing.T) {
	pool, schema, w := e2e(t)
	hook := memory.New()
	// Alone, the webhook relay would take ~5 s to drain: the outbox lasts
	// until the second relay has its lanes.
	hook.SetDelay(100 * time.Millisecond)
	startWebhookRelay(t, schema, hook, 10)
	const n = 2000
	writeOrders(t, pool, w, n)

	code, out, stderr := run(t, "run", "--sink", "stdout", "--allow-config-change", "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "relays of the route run different configurations and share its lanes")
	require.NotEmpty(t, out, "the stdout relay delivered its share")
	lines := strings.Count(out, "\n")
	require.Less(t, lines, n)
}

// status names the configurations of a route whose relays disagree.
func TestStatusShowsRoutesWhoseRelaysDisagree(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+migrations.Ident(schema)+`.relays
		(id, hostname, pid, version, backend_pid, route, config_hash, config_summary) VALUES
		('a', 'h', 1, 'v', 0, 'orders', '1:aa', 'sink https://hooks.example/orders, topics *, on-dead-letter skip'),
		('b', 'h', 2, 'v', 0, 'orders', '1:aa', 'sink https://hooks.example/orders, topics *, on-dead-letter skip'),
		('c', 'h', 3, 'v', 0, 'orders', '1:bb', 'sink stdout, topics *, on-dead-letter skip'),
		('d', 'h', 4, 'v', 0, 'audit', '1:cc', 'sink stdout, topics audit.*, on-dead-letter skip')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, `WARNING: route "orders": its relays run 2 different configurations and share its lanes`)
	require.Contains(t, out, "  a, b: sink https://hooks.example/orders, topics *, on-dead-letter skip\n")
	require.Contains(t, out, "  c: sink stdout, topics *, on-dead-letter skip\n")
	require.NotContains(t, out, `route "audit": its relays run`)
	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"mixed_configs": [`)
	require.Contains(t, out, `"config": "sink stdout, topics *, on-dead-letter skip"`)
}
