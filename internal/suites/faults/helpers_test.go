package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// ---- small utilities -------------------------------------------------------

// eventually polls cond every interval until it reports true, failing the
// test with cond's last explanation after timeout.
func eventually(t testing.TB, timeout, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	testkit.Eventually(t, timeout, interval, cond)
}

// syncBuffer is a goroutine-safe buffer for a child's output or a
// logger, with the suite's line searches.
type syncBuffer struct{ testkit.SyncBuffer }

// Count returns how many lines contain sub.
func (b *syncBuffer) Count(sub string) int {
	n := 0
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// matching returns the first n lines that contain sub, for failure
// messages.
func (b *syncBuffer) matching(sub string, n int) string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, sub) {
			if len(out) == n {
				out = append(out, "…")
				break
			}
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// tail returns the last n lines, for failure messages.
func (b *syncBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- database --------------------------------------------------------------

// dbURL returns the test database URL with extra query parameters and,
// when user is not empty, another user name (the local server trusts
// loopback connections).
func dbURL(t testing.TB, user string, params ...string) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	if user != "" {
		u.User = url.User(user)
	}
	q := u.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func count(t testing.TB, pool *pgxpool.Pool, schema, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+migrations.Ident(schema)+"."+table).Scan(&n))
	return n
}

// attempted counts the pending rows that have an attempt counted.
func attempted(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+migrations.Ident(schema)+".messages WHERE attempts > 0").Scan(&n))
	return n
}

func deadLetters(t testing.TB, pool *pgxpool.Pool, schema string) []operator.DeadLetter {
	t.Helper()
	admin, err := operator.New(pool, schema)
	require.NoError(t, err)
	dls, err := admin.List(context.Background(), operator.Selection{All: true, Limit: 100000})
	require.NoError(t, err)
	return dls
}

// payloadOf is the unique payload of message seq of key in topic; tests
// identify messages by it.
func payloadOf(topic, key string, seq int) string { return fmt.Sprintf("%s|%s|%d", topic, key, seq) }

// parsePayload splits a payload made by payloadOf.
func parsePayload(p string) (key string, seq int, ok bool) {
	parts := strings.Split(p, "|")
	if len(parts) != 3 {
		return "", 0, false
	}
	n, err := strconv.Atoi(parts[2])
	return parts[1], n, err == nil
}

// messages returns n messages of topic spread round-robin over keys, with
// sequence numbers from..from+n-1.
func messages(topic string, keys []string, from, n int, headers map[string]string) []outbox.Message {
	out := make([]outbox.Message, 0, n)
	for i := from; i < from+n; i++ {
		k := keys[i%len(keys)]
		out = append(out, outbox.Message{Topic: topic, Key: k, Payload: []byte(payloadOf(topic, k, i)), Headers: headers})
	}
	return out
}

func keyNames(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ks
}

// commit writes msgs in transactions of at most 1000 and returns their
// payloads.
func commit(t testing.TB, pool *pgxpool.Pool, schema string, msgs []outbox.Message) []string {
	t.Helper()
	out, err := commitErr(pool, schema, msgs)
	require.NoError(t, err)
	return out
}

// commitErr is commit for goroutines other than the test's: it returns the
// payloads committed so far and the first error.
func commitErr(pool *pgxpool.Pool, schema string, msgs []outbox.Message) ([]string, error) {
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, MaxPayloadBytes: -1})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var out []string
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		err := func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
			if err := w.Write(ctx, tx, msgs[:n]...); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}()
		if err != nil {
			return out, err
		}
		for _, m := range msgs[:n] {
			out = append(out, string(m.Payload))
		}
		msgs = msgs[n:]
	}
	return out, nil
}

// bulkInsert writes n small messages with one INSERT ... generate_series per
// 100k rows (fast backlogs for load tests): payload = 200 bytes, 1,000 keys.
func bulkInsert(t testing.TB, pool *pgxpool.Pool, schema, topic string, n int) {
	t.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		k := min(n-done, 100_000)
		_, err := pool.Exec(ctx, `INSERT INTO `+migrations.Ident(schema)+`.messages (topic, key, payload)
SELECT $1, 'k' || (g % 1000), convert_to(rpad(g::text, 200, 'x'), 'UTF8') FROM generate_series($2::int, $3::int) g`,
			topic, done, done+k-1)
		require.NoError(t, err)
		done += k
	}
}

// ---- delivery checks ---------------------------------------------------------

// delivery is one message as a consumer saw it.
type delivery struct {
	ID, Topic, Key string
	Payload        string
	Path           string // HTTP request path
	Header         http.Header
	At             time.Time
}

// checkAllDelivered asserts that every payload in want arrived at least
// once and returns how many extra deliveries (duplicates) there were.
func checkAllDelivered(t testing.TB, want []string, got []delivery) (dups int) {
	t.Helper()
	seen := make(map[string]int, len(got))
	for _, d := range got {
		seen[d.Payload]++
	}
	var missing []string
	for _, p := range want {
		if seen[p] == 0 {
			missing = append(missing, p)
		}
	}
	if n := len(missing); n > 0 {
		if n > 10 {
			missing = append(missing[:10], fmt.Sprintf("… %d more", n-10))
		}
		t.Fatalf("%d of %d committed messages never delivered: %v", n, len(want), missing)
	}
	for _, n := range seen {
		if n > 1 {
			dups += n - 1
		}
	}
	return dups
}

// checkKeyOrder asserts per-key order on the first delivery of every
// message (a redelivery after a crash may repeat earlier messages, which
// consumers drop by id).
func checkKeyOrder(t testing.TB, got []delivery) {
	t.Helper()
	first := map[string]bool{}
	last := map[string]int{}
	for _, d := range got {
		if first[d.Payload] {
			continue
		}
		first[d.Payload] = true
		key, seq, ok := parsePayload(d.Payload)
		if !ok || key == "" {
			continue
		}
		if prev, seen := last[key]; seen && seq < prev {
			t.Fatalf("key %s out of order: %d delivered (first time) after %d", key, seq, prev)
		}
		last[key] = seq
	}
}

// ---- HTTP receiver -------------------------------------------------------------

// receiver records what a testkit.Receiver accepts; it can be taken down
// (stop: connections are refused) and brought back on the same port.
type receiver struct {
	*testkit.Receiver
	t testing.TB

	mu  sync.Mutex
	got []delivery
}

// newReceiver starts a receiver; handle decides the answer (nil accepts
// everything) before the delivery is recorded, and only 2xx answers are
// recorded.
func newReceiver(t testing.TB, handle func(r *http.Request, body []byte) (int, string)) *receiver {
	rc := &receiver{t: t}
	rc.Receiver = testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if handle != nil {
			if code, msg := handle(r.Request, r.Body); code/100 != 2 {
				return code, msg
			}
		}
		topic, _ := url.PathUnescape(r.Header.Get("outbox-topic"))
		key, _ := url.PathUnescape(r.Header.Get("outbox-key"))
		d := delivery{ID: r.Header.Get("webhook-id"), Topic: topic, Key: key, Payload: string(r.Body), Path: r.URL.Path, Header: r.Header.Clone(), At: time.Now()}
		rc.mu.Lock()
		rc.got = append(rc.got, d)
		rc.mu.Unlock()
		return http.StatusNoContent, ""
	})
	return rc
}

func (rc *receiver) url() string { return rc.URL() }

// start brings a stopped receiver back on its port.
func (rc *receiver) start() {
	rc.t.Helper()
	require.NoError(rc.t, rc.Start())
}

// stop closes the listener and every connection: the receiver is down.
func (rc *receiver) stop() { rc.Stop() }

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

func (rc *receiver) requests() int { return int(rc.Requests()) }

// distinct counts distinct payloads received.
func distinct(ds []delivery) int {
	m := make(map[string]bool, len(ds))
	for _, d := range ds {
		m[d.Payload] = true
	}
	return len(m)
}

// ---- relay in this process ---------------------------------------------------------

// inproc is a relay.Relay running in the test process.
type inproc struct {
	r      *relay.Relay
	pool   *pgxpool.Pool
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

// runInproc starts a relay on schema with sink; the pool comes from
// relay.NewPool (the production session settings) on databaseURL. The
// relay is stopped, and the sink closed, when the test ends.
func runInproc(t testing.TB, databaseURL, schema string, sink sinks.Sink, cfg relay.Config) *inproc {
	t.Helper()
	cfg.Schema = schema
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: databaseURL, Workers: cfg.Workers, PublishTimeout: cfg.PublishTimeout})
	if err != nil {
		cancel()
		t.Fatalf("relay pool: %v", err)
	}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := relay.New(pool, sink, cfg)
	if err != nil {
		cancel()
		pool.Close()
		t.Fatalf("relay.New: %v", err)
	}
	p := &inproc{r: r, pool: pool, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		p.stop(t)
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = sink.Close(cctx)
		pool.Close()
	})
	return p
}

// stop cancels Run and waits for it; it is idempotent.
func (p *inproc) stop(t testing.TB) {
	p.cancel()
	select {
	case err, ok := <-p.done:
		if ok && err != nil {
			t.Errorf("relay.Run: %v", err)
		}
		close(p.done)
	case <-time.After(60 * time.Second):
		t.Errorf("relay did not stop within 60s; logs:\n%s", p.logs.tail(30))
	}
}

// countingSink wraps a real sink and records, per message id, when each
// attempt was made (a message reported ErrNotAttempted was not attempted),
// and when each Send that attempted nothing returned.
type countingSink struct {
	inner sinks.Sink
	mu    sync.Mutex
	tries map[string][]time.Time
	// unreached: when each Send that attempted none of its messages (the
	// sink could not reach its backend) returned.
	unreached []time.Time
}

func newCountingSink(inner sinks.Sink) *countingSink {
	return &countingSink{inner: inner, tries: map[string][]time.Time{}}
}

func (c *countingSink) Send(ctx context.Context, msgs []sinks.Message) error {
	at := time.Now()
	err := c.inner.Send(ctx, msgs)
	c.mu.Lock()
	defer c.mu.Unlock()
	tried := 0
	for i, m := range msgs {
		if oe := sinks.Outcome(err, i, len(msgs)); errors.Is(oe, sinks.ErrNotAttempted) {
			continue
		}
		tried++
		c.tries[m.ID] = append(c.tries[m.ID], at)
	}
	if err != nil && tried == 0 {
		c.unreached = append(c.unreached, time.Now())
	}
	return err
}

// firstUnreached is when the first Send after t that attempted none of
// its messages returned; zero if none did.
func (c *countingSink) firstUnreached(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, at := range c.unreached {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

func (c *countingSink) Close(ctx context.Context) error { return c.inner.Close(ctx) }

// attempts returns a copy of the attempt times per message id.
func (c *countingSink) attempts() map[string][]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]time.Time, len(c.tries))
	for k, v := range c.tries {
		out[k] = append([]time.Time(nil), v...)
	}
	return out
}

// ---- relay binary -------------------------------------------------------------------

// relayProc is the outbox-relay binary running as a child process.
type relayProc struct {
	*testkit.Relay
	t      testing.TB
	stdout *syncBuffer
	logs   *syncBuffer // stderr: JSON logs
	admin  string
}

// cli runs a command of the binary to completion and returns its exit
// code, stdout and stderr.
func cli(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	return cliEnv(t, nil, args...)
}

// cliEnv is cli with extra environment variables (NAME=value).
func cliEnv(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBinary(t), args...)
	cmd.Env = append(testkit.CleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("outbox-relay %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// startRelay starts `outbox-relay run` with the test's database and schema,
// an admin listener on a free loopback port, JSON logs and a 50ms poll
// interval; args come last and win. It returns once the relay logged its
// admin listener's address. The process is stopped (SIGTERM, then SIGKILL
// after 30s) when the test ends.
func startRelay(t testing.TB, databaseURL, schema string, args ...string) *relayProc {
	t.Helper()
	full := append([]string{"run", "--database-url", databaseURL, "--schema", schema,
		"--admin-addr", "127.0.0.1:0", "--log-format", "json", "--poll-interval", "50ms"}, args...)
	p := &relayProc{t: t, stdout: &syncBuffer{}, logs: &syncBuffer{}}
	r, err := testkit.StartRelay(context.Background(), testkit.RelayConfig{
		Bin: relayBinary(t), Args: full, Stdout: p.stdout, Stderr: p.logs,
	})
	require.NoError(t, err)
	p.Relay = r
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("relay %d logs (tail):\n%s", p.Pid(), p.logs.tail(40))
		}
	})
	eventually(t, 15*time.Second, 20*time.Millisecond, func() (bool, string) {
		if !p.Alive() {
			t.Fatalf("relay exited at start-up (%v):\n%s", p.State(), p.logs.tail(20))
		}
		for _, l := range p.logLines() {
			if l["msg"] == "admin listener" {
				p.admin, _ = l["addr"].(string)
				return true, ""
			}
		}
		return false, "no admin listener line in the relay's logs:\n" + p.logs.tail(10)
	})
	return p
}

func (p *relayProc) pid() int { return p.Pid() }

// logLines decodes the JSON log lines written so far.
func (p *relayProc) logLines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// stop sends SIGTERM and waits up to 30s, then kills. Idempotent.
func (p *relayProc) stop() {
	if err := p.Stop(); err != nil {
		p.t.Errorf("%v", err)
	}
}

// wait waits for the process to exit by itself and returns its exit code.
func (p *relayProc) wait(timeout time.Duration) int {
	p.t.Helper()
	if !p.Wait(timeout) {
		p.t.Fatalf("relay did not exit within %s; logs:\n%s", timeout, p.logs.tail(30))
		return -1
	}
	return p.ExitCode()
}

// memory returns VmRSS and VmHWM of the running process, in bytes.
func (p *relayProc) memory() (rss, hwm int64, err error) { return p.Memory() }

// cpuTime is the CPU time (user + system) the process has used so far.
func (p *relayProc) cpuTime() (time.Duration, error) { return p.CPUTime() }

// metric sums every series of the named metric on the relay's /metrics.
// publishedMore waits until the relay published n messages more than now
// (its outbox_relay_messages_published_total): it delivers.
func (p *relayProc) publishedMore(n float64) {
	p.t.Helper()
	mark, _ := p.metric("outbox_relay_messages_published_total")
	eventually(p.t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		v, err := p.metric("outbox_relay_messages_published_total")
		return err == nil && v >= mark+n, fmt.Sprintf("published %v of %v more (%v)\n%s", v-mark, n, err, p.logs.tail(5))
	})
}

func (p *relayProc) metric(name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) {
			continue
		}
		rest := l[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not exported", name)
	}
	return sum, sc.Err()
}

// get fetches path from the relay's admin listener.
func (p *relayProc) get(path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func itoa(n int) string { return strconv.Itoa(n) }

// fromMemory turns what a memory sink delivered into deliveries.
func fromMemory(ms []sinks.Message) []delivery {
	out := make([]delivery, len(ms))
	for i, m := range ms {
		out[i] = delivery{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: string(m.Payload)}
	}
	return out
}

// steadyWriter is the outage tests' application: it commits 20 messages of
// topic "orders" over 30 keys every 50ms until stopped.
type steadyWriter struct {
	mu      sync.Mutex
	written []string
	stopped chan struct{}
	done    chan struct{}
	once    sync.Once
}

// startSteadyWriter starts writing with headers on every message; the
// writer is stopped when the test ends if stop was not called.
func startSteadyWriter(t testing.TB, pool *pgxpool.Pool, schema string, headers map[string]string) *steadyWriter {
	w := &steadyWriter{stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		keys := keyNames("k", 30)
		for seq := 0; ; seq += 20 {
			select {
			case <-w.stopped:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ps, err := commitErr(pool, schema, messages("orders", keys, seq, 20, headers))
			if err != nil {
				t.Errorf("writer: %v", err)
				return
			}
			w.mu.Lock()
			w.written = append(w.written, ps...)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// count is how many messages the writer committed so far.
func (w *steadyWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.written)
}

// writeMore waits until the writer committed n messages more than now:
// time measured in the applications' writes, so that an outage leaves the
// same backlog on a fast machine and a loaded one. sample, when not nil,
// runs at every check.
func (w *steadyWriter) writeMore(t testing.TB, n int, sample func()) {
	t.Helper()
	mark := w.count()
	// The writer commits 20 messages every 50ms or so; a loaded machine
	// may take several times as long, but not forever.
	timeout := time.Duration(n)*time.Second/steadyRate*6 + 30*time.Second
	eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		if sample != nil {
			sample()
		}
		got := w.count() - mark
		return got >= n, fmt.Sprintf("the writer committed %d of %d more messages", got, n)
	})
}

// steadyRate is the steady writer's pace, in messages a second, when the
// machine keeps up: 20 every 50ms.
const steadyRate = 400

// stop stops the writer, waits for its last commit, and returns the
// payloads of every message it committed.
func (w *steadyWriter) stop() []string {
	w.once.Do(func() { close(w.stopped) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.written...)
}
