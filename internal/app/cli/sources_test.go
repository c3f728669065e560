package cli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// testOutbox is an outbox of a sources test: a migrated schema of the
// test database, its pool and a writer.
type testOutbox struct {
	pool   *pgxpool.Pool
	schema string
	w      *outbox.Writer
}

// write commits msgs to ob in one transaction.
func (ob testOutbox) write(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := ob.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, ob.w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))
}

// sourceOutboxes makes an outbox for each name, and takes the database
// URL out of the environment (a sources list refuses one beside it).
func sourceOutboxes(t *testing.T, names ...string) map[string]testOutbox {
	t.Helper()
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	obs := map[string]testOutbox{}
	for _, name := range names {
		pool, schema := pgtest.Schema(t)
		w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
		require.NoError(t, err)
		obs[name] = testOutbox{pool: pool, schema: schema, w: w}
	}
	return obs
}

// sourcesFile writes a config file of the outboxes named and returns its
// path.
func sourcesFile(t *testing.T, extra string, obs map[string]testOutbox, names ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(extra)
	b.WriteString("sources:\n")
	for _, name := range names {
		fmt.Fprintf(&b, "  - name: %s\n    database-url: %s\n    schema: %s\n", name, pgtest.URL(), obs[name].schema)
	}
	f := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(f, []byte(b.String()), 0o600))
	return f
}

// One process relays from two outboxes into one webhook: every message
// of each arrives once, in order per key of its outbox (told apart by
// the outbox-producer header), each poison message is dead-lettered in
// its own outbox, and the commands see each source.
func TestRunSources(t *testing.T) {
	t.Setenv("OUTBOX_ADMIN_ADDR", "127.0.0.1:0")
	t.Setenv("OUTBOX_POLL_INTERVAL", "20ms")
	obs := sourceOutboxes(t, "a", "b")
	for _, ob := range obs {
		appOrders(t, ob.pool, ob.w, 100, outbox.Message{Topic: "orders", Key: "poison", Payload: []byte("{}")})
	}
	var mu sync.Mutex
	byProducer := map[string][]string{}
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if string(r.Body) == "{}" {
			return http.StatusBadRequest, "poison"
		}
		mu.Lock()
		defer mu.Unlock()
		p := r.Header.Get("outbox-producer")
		byProducer[p] = append(byProducer[p], string(r.Body))
		return http.StatusOK, ""
	})
	f := sourcesFile(t, "sink: "+srv.URL()+"\n", obs, "a", "b")
	code, _, stderr := run(t, "run", "--config", f, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	mu.Lock()
	require.Len(t, byProducer, 2, "one producer per source: %v", keys(byProducer))
	for p, got := range byProducer {
		require.Len(t, got, 101, "producer %s: every committed message but the poison one", p)
		checkSeqOrder(t, got)
	}
	mu.Unlock()
	require.Contains(t, stderr, "source=a")
	require.Contains(t, stderr, "source=b")

	code, out, stderr := run(t, "status", "--config", f)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "== source a ==")
	require.Contains(t, out, "== source b ==")
	require.Regexp(t, `(?m)^a\s+ok\s+0\s+0\s+\S+\s+1\s`, out, "a summary line a source, its dead letter counted")

	code, _, stderr = run(t, "dlq", "list", "--config", f)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "give --source to pick the one this command acts on")
	code, out, stderr = run(t, "dlq", "list", "--config", f, "--source", "b", "--json")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, strings.Count(out, `"reason"`), out)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Mistakes in a sources list exit 2 naming the field.
func TestRunSourcesConfigErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	dir := t.TempDir()
	url := "postgres://x@127.0.0.1:1/d"
	for _, tc := range []struct {
		yaml string
		args []string
		want string
	}{
		{"sources: []\n", nil, "sources: empty list"},
		{"sources:\n  - name: A\n    database-url: " + url + "\n", nil, `sources[0].name: "A" must be`},
		{"sources:\n  - name: a\n", nil, "sources[0].database-url: required"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n    database-url-file: /x\n", nil, "give database-url or database-url-file, not both"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n  - name: a\n    database-url: " + url + "\n", nil, `sources[1].name: "a" used twice`},
		{"sources:\n  - name: a\n    database-url: " + url + "\n    colour: red\n", nil, `unknown key "colour"`},
		{"sources:\n  - name: a\n    database-url: mysql://x/y\n", nil, `sources[0]: outbox: database-url: scheme "mysql"`},
		{"sources:\n  - name: a\n    database-url: " + url + "\n    schema: " + strings.Repeat("s", 70) + "\n", nil, "sources[0].schema: 70 bytes is longer"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n", []string{"--database-url", url}, "the config file lists sources"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n", []string{"--source", "z"}, `source: "z" is not one of the config file's sources (a)`},
		{"sink: stdout\n", []string{"--source", "a", "--database-url", url}, "the config file lists no sources"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n", []string{"--producer", "p"}, "producer: names one outbox"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n    weight: -1\n", nil, "sources[0].weight: must be 1 or more, got -1"},
		{"sources:\n  - name: a\n    database-url: " + url + "\n", []string{"--source-batches", "0"}, "source-batches: must be 1 or more, got 0"},
	} {
		f := filepath.Join(dir, "c.yaml")
		require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
		code, _, stderr := run(t, append([]string{"run", "--config", f, "--sink", "stdout"}, tc.args...)...)
		require.Equal(t, 2, code, "%s: %s", tc.yaml, stderr)
		require.Contains(t, stderr, tc.want, tc.yaml)
	}
}

// SIGHUP makes a running process read its sources list again: a source
// added starts and delivers, a source removed stops and its later
// messages wait in its outbox, a list that cannot run is refused and the
// running sources go on.
func TestRunSourcesReloadOnHangup(t *testing.T) {
	t.Setenv("OUTBOX_POLL_INTERVAL", "20ms")
	obs := sourceOutboxes(t, "a", "b")
	writers := map[string]func(n int){}
	for name, ob := range obs {
		writers[name] = func(n int) {
			for i := range n {
				ob.write(t, outbox.Message{Topic: "t", Key: "k", Payload: fmt.Appendf(nil, "%s:%d", name, i)})
			}
		}
	}
	var mu sync.Mutex
	got := map[string]int{}
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		src, _, _ := strings.Cut(string(r.Body), ":")
		mu.Lock()
		got[src]++
		mu.Unlock()
		return http.StatusOK, ""
	})
	count := func(src string) int { mu.Lock(); defer mu.Unlock(); return got[src] }
	f := sourcesFile(t, "sink: "+srv.URL()+"\n", obs, "a")
	rewrite := func(names ...string) {
		next := sourcesFile(t, "sink: "+srv.URL()+"\n", obs, names...)
		b, err := os.ReadFile(next)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(f, b, 0o600))
	}
	logs := &testkit.SyncBuffer{}
	runCtx, stop := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(runCtx, []string{"run", "--config", f, "--admin-addr", ""}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()
	inLogs := func(s string) func() bool { return func() bool { return strings.Contains(logs.String(), s) } }
	require.Eventually(t, inLogs("msg=starting"), 20*time.Second, 10*time.Millisecond, "started: %s", logs.String())
	hangup := func() { require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP)) }

	writers["a"](10)
	writers["b"](10)
	require.Eventually(t, func() bool { return count("a") == 10 }, 20*time.Second, 10*time.Millisecond)
	require.Zero(t, count("b"))

	rewrite("a", "b")
	hangup()
	require.Eventually(t, func() bool { return count("b") == 10 }, 20*time.Second, 10*time.Millisecond, "b added: %s", logs.String())
	require.Contains(t, logs.String(), `added=[b]`)

	rewrite("b")
	hangup()
	require.Eventually(t, inLogs(`removed=[a]`), 20*time.Second, 10*time.Millisecond, logs.String())
	writers["a"](5)
	writers["b"](5)
	require.Eventually(t, func() bool { return count("b") == 15 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, 10, count("a"), "a's later messages wait in its outbox")

	require.NoError(t, os.WriteFile(f, []byte("sink: "+srv.URL()+"\nsources: []\n"), 0o600))
	hangup()
	require.Eventually(t, inLogs("sources not reloaded"), 20*time.Second, 10*time.Millisecond, logs.String())
	writers["b"](1)
	require.Eventually(t, func() bool { return count("b") == 16 }, 20*time.Second, 10*time.Millisecond, "b goes on")
}
