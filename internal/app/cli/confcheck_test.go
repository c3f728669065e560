package cli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// startWebhookRelay runs, until the test ends (or stop is called), an
// embedded relay of the default route whose sink stands for a webhook,
// and waits until it holds every lane.
func startWebhookRelay(t *testing.T, schema string, sink *memory.Sink, batchSize int) (r *relay.Relay, stop func()) {
	t.Helper()
	cfg := relay.Config{Schema: schema, Destination: "https://hooks.example/orders", PollInterval: 20 * time.Millisecond,
		LeaseTTL: 3 * time.Second, Heartbeat: 200 * time.Millisecond, BatchSize: batchSize}
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: relay.DefaultWorkers})
	require.NoError(t, err)
	r, err = relay.New(pool, sink, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
			pool.Close()
		})
	}
	t.Cleanup(stop)
	testkit.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return r.OwnedLanes() == 256, fmt.Sprintf("the webhook relay holds %d lanes", r.OwnedLanes())
	})
	return r, stop
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

// Issue 34: `run --sink stdout --on-config-change fail` beside a relay of
// the same route that delivers to a webhook takes none of its lanes: it
// exits 2 naming both configurations, and everything written goes to the
// webhook.
func TestRunRefusesARouteThatRunsAnotherSink(t *testing.T) {
	pool, schema, w := e2e(t)
	hook := memory.New()
	startWebhookRelay(t, schema, hook, 0)
	const n = 200
	writeOrders(t, pool, w, n)

	code, out, stderr := run(t, "run", "--sink", "stdout", "--on-config-change", "fail")
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

// background runs the CLI with args until the test ends (or stop is
// called, which returns its exit code), its admin listener on a free
// address; out and logs collect its standard output and error.
type background struct {
	addr      string
	out, logs *testkit.SyncBuffer
	stop      func() int
}

func runInBackground(t *testing.T, args ...string) *background {
	t.Helper()
	b := &background{addr: freeAddr(t), out: &testkit.SyncBuffer{}, logs: &testkit.SyncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() { exited <- cli.MainContext(ctx, append(args, "--admin-addr", b.addr), b.out, b.logs) }()
	var once sync.Once
	code := 0
	b.stop = func() int {
		once.Do(func() {
			cancel()
			code = <-exited
		})
		return code
	}
	t.Cleanup(func() { b.stop() })
	return b
}

// readyz returns the relay's /readyz status and body (0 while it does not
// answer).
func (b *background) readyz() (int, string) {
	resp, err := http.Get("http://" + b.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// awaitReadyz waits until /readyz answers status with a body holding
// every one of want.
func (b *background) awaitReadyz(t *testing.T, status int, want ...string) string {
	t.Helper()
	var got int
	var body string
	testkit.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		got, body = b.readyz()
		ok := got == status
		for _, w := range want {
			ok = ok && strings.Contains(body, w)
		}
		return ok, fmt.Sprintf("/readyz: %d %s; logs:\n%s", got, body, b.logs.String())
	})
	return body
}

// Red team, finding 5: by default `run` beside live relays of another
// configuration of its route neither exits nor takes a lane: it waits,
// /readyz answering 503 with the running relays' configuration, and takes
// the route over once they are gone (the end of a rolling change).
func TestRunWaitsForTheRelaysOfAnotherConfiguration(t *testing.T) {
	pool, schema, w := e2e(t)
	hook := memory.New()
	_, stopHook := startWebhookRelay(t, schema, hook, 0)
	writeOrders(t, pool, w, 100)

	b := runInBackground(t, "run", "--sink", "stdout")
	b.awaitReadyz(t, http.StatusServiceUnavailable, "waits until they are gone", "sink https://hooks.example/orders", "This relay: sink stdout")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, hook.WaitFor(ctx, 100))
	require.Empty(t, b.out.String(), "the waiting relay delivered nothing")

	stopHook()
	b.awaitReadyz(t, http.StatusOK)
	writeOrders(t, pool, w, 50)
	testkit.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := strings.Count(b.out.String(), "\n")
		return n == 50, fmt.Sprintf("the relay printed %d of 50 messages", n)
	})
	require.Equal(t, 0, b.stop(), b.logs.String())
	require.Contains(t, b.logs.String(), "waiting for the route's relays of another configuration to leave")
	require.Contains(t, b.logs.String(), "no live relay of the route runs another configuration any more")
	require.Len(t, hook.Delivered(), 100, "the webhook got only what was written before")
}

// Red team, finding 5: two webhooks on one host that differ in their path
// are two configurations of the route (a relay posting to /b beside one
// posting to /a takes no lane); one that differs from the running relay
// only in its tuning (timeout, max_concurrency) is the same, and shares
// the route's lanes.
func TestRunTellsWebhookPathsApartNotTheirTuning(t *testing.T) {
	e2e(t)
	var mu sync.Mutex
	hits := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)

	a := runInBackground(t, "run", "--sink", srv.URL+"/a")
	a.awaitReadyz(t, http.StatusOK)

	code, out, stderr := run(t, "run", "--sink", srv.URL+"/b", "--on-config-change", "fail")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "live relays of the route run another configuration")
	require.Regexp(t, `This relay: sink http://127\.0\.0\.1:\d+/… \(target [0-9a-f]{8}\)`, stderr)
	require.Empty(t, out)

	tuned := runInBackground(t, "run", "--sink", srv.URL+"/a?timeout=5s&max_concurrency=4", "--on-config-change", "fail")
	tuned.awaitReadyz(t, http.StatusOK)
	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 2, strings.Count(out, `"config_hash"`), out)
	require.NotContains(t, out, `"mixed_configs": [`, "one configuration")
	require.Equal(t, 0, tuned.stop(), tuned.logs.String())
	require.Equal(t, 0, a.stop(), a.logs.String())
}
