package amqpsink

import (
	"context"
	"fmt"
	"log/slog"
	neturl "net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/amqptest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// unavailable fails the test under CI=true, else skips it, with reason.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	testkit.Unavailable(tb, "service", format, args...)
}

// testEnv is one sink publishing to its own exchange, with its own queue
// and a real consumer reading that queue.
type testEnv struct {
	t        testing.TB
	url      string // the broker: TEST_AMQP_URL unless onBroker
	sink     *Sink
	cfg      Config
	admin    *amqp.Connection
	adminCh  *amqp.Channel
	exchange string
	queue    string
	prefix   string // routing keys of bound topics start with prefix + "."
	durable  bool
	noReader bool // no consumer: messages stay in the queue
	deliv    <-chan amqp.Delivery
	proxied  bool            // the sink connects through proxy
	proxy    *tcpproxy.Proxy // set when proxied

	mu    sync.Mutex
	bound map[string]bool
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }
func durable() envOpt                   { return func(e *testEnv) { e.durable = true } }
func noReader() envOpt                  { return func(e *testEnv) { e.noReader = true } }

// viaProxy makes the sink connect through a tcpproxy (testEnv.proxy), so
// that a test can refuse its connections, as a broker that is down does,
// without touching the broker. The test's own connection goes direct.
func viaProxy() envOpt { return func(e *testEnv) { e.proxied = true } }

// onBroker uses a throwaway broker instead of the shared one at
// TEST_AMQP_URL: for tests that stop or reconfigure it.
func onBroker(b *amqptest.Broker) envOpt { return func(e *testEnv) { e.url = b.URL() } }

// setup declares a direct exchange and a queue with random names, starts a
// consumer and a sink. Topics are bound on demand by topic().
func setup(tb testing.TB, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{
		t:        tb,
		url:      testkit.AMQPURL(),
		exchange: testkit.RandName("outbox-test-x"),
		queue:    testkit.RandName("outbox-test-q"),
		prefix:   testkit.RandName("t"),
		bound:    map[string]bool{},
	}
	e.cfg = Config{
		Exchange:         e.exchange,
		ConnectionName:   testkit.RandName("outbox-test-conn"),
		PublishTimeout:   10 * time.Second,
		ReconnectInitial: 20 * time.Millisecond,
		ReconnectMax:     200 * time.Millisecond,
		// The Poison message of the conformance harness carries this
		// header to get a routing key no queue is bound for.
		RoutingKey: "{topic}{header:x-test-route}",
	}
	for _, o := range opts {
		o(e)
	}
	url := e.url
	e.cfg.URL = url
	if e.proxied {
		u, err := neturl.Parse(url)
		require.NoError(tb, err)
		e.proxy = tcpproxy.New(tb, u.Host)
		u.Host = e.proxy.Addr()
		e.cfg.URL = u.String()
	}
	admin, err := amqp.Dial(url)
	if err != nil && url == testkit.AMQPURL() {
		unavailable(tb, "RabbitMQ not reachable at TEST_AMQP_URL (%s): %v", redactURL(url), err)
	}
	require.NoError(tb, err, "throwaway broker at %s", url)
	e.admin = admin
	ch, err := admin.Channel()
	require.NoError(tb, err)
	e.adminCh = ch
	require.NoError(tb, ch.ExchangeDeclare(e.exchange, "direct", e.durable, false, false, false, nil))
	_, err = ch.QueueDeclare(e.queue, e.durable, false, false, false, nil)
	require.NoError(tb, err)
	// A consumer on its own channel, so that deleting the exchange (which
	// is fine) or a failed declare on the admin channel cannot stop it.
	if !e.noReader {
		cch, err := admin.Channel()
		require.NoError(tb, err)
		e.deliv, err = cch.Consume(e.queue, "", true, false, false, false, nil)
		require.NoError(tb, err)
	}
	tb.Cleanup(func() {
		_ = admin.Close()
		// A fresh connection: the admin one may be gone with a broker
		// restart, its channel closed by a failed operation.
		c, err := amqp.Dial(url)
		if err != nil {
			tb.Errorf("cleanup: %v", err)
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(e.queue, false, false, false)
			_ = ch.ExchangeDelete(e.exchange, false, false)
		}
	})

	s, err := New(e.cfg, slog.New(slog.NewTextHandler(testkit.LogWriter(tb), &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(tb, err)
	e.sink = s
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(tb, s.Close(ctx))
	})
	return e
}

func redactURL(raw string) string {
	c := Config{URL: raw}
	return c.Redacted()
}

// topic returns a topic whose routing key is bound to the env's queue.
func (e *testEnv) topic(suffix string) string {
	suffix = strings.NewReplacer(".", "_", " ", "_").Replace(suffix)
	t := e.prefix + "." + suffix
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.bound[t] {
		require.NoError(e.t, e.adminCh.QueueBind(e.queue, t, e.exchange, false, nil))
		e.bound[t] = true
	}
	return t
}

// unboundTopic returns a topic no queue is bound for.
func (e *testEnv) unboundTopic() string { return e.prefix + ".nowhere" }

// breakExchange deletes the exchange; restore declares it and its bindings
// again.
func (e *testEnv) breakExchange() (restore func()) {
	require.NoError(e.t, e.adminCh.ExchangeDelete(e.exchange, false, false))
	return func() {
		require.NoError(e.t, e.adminCh.ExchangeDeclare(e.exchange, "direct", e.durable, false, false, false, nil))
		e.mu.Lock()
		defer e.mu.Unlock()
		for t := range e.bound {
			require.NoError(e.t, e.adminCh.QueueBind(e.queue, t, e.exchange, false, nil))
		}
	}
}

// read returns the next n deliveries.
func (e *testEnv) read(ctx context.Context, n int) ([]amqp.Delivery, error) {
	out := make([]amqp.Delivery, 0, n)
	for len(out) < n {
		select {
		case d, ok := <-e.deliv:
			if !ok {
				return out, fmt.Errorf("consumer closed after %d of %d messages", len(out), n)
			}
			out = append(out, d)
		case <-ctx.Done():
			return out, fmt.Errorf("read %d of %d messages: %w", len(out), n, ctx.Err())
		}
	}
	return out, nil
}

func (e *testEnv) mustRead(n int) []amqp.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := e.read(ctx, n)
	require.NoError(e.t, err)
	return ds
}

// restartConn closes the sink's connection from the broker side, found by
// its unique connection_name. Only this sink's connection is touched:
// other packages' tests share the broker.
func (e *testEnv) restartConn() error {
	out, err := exec.Command("rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	needle := fmt.Sprintf(`{"connection_name","%s"}`, e.cfg.ConnectionName)
	var closed int
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, needle) {
			continue
		}
		pid, _, _ := strings.Cut(line, "\t")
		if out, err := exec.Command("rabbitmqctl", "close_connection", pid, "outbox-relay test restart").CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl close_connection: %v: %s", err, out)
		}
		closed++
	}
	if closed == 0 {
		return fmt.Errorf("no connection named %s", e.cfg.ConnectionName)
	}
	return nil
}

func needRabbitmqctl(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(tb, "rabbitmqctl not in PATH (needed to close connections from the broker side): %v", err)
	}
}

// msgs returns n messages of ~size bytes on topic, keys cycling over keys
// ("" when keys is 0).

func headerString(d amqp.Delivery, name string) string {
	v, _ := d.Headers[name].(string)
	return v
}
