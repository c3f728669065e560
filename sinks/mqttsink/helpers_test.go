package mqttsink

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/mqtttest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// deniedPrefix starts the topics the test brokers' ACL refuses to
// anonymous clients: a publish there gets PUBACK 0x87 (not authorized).
const deniedPrefix = "denied/"

// broker starts the test's own Mosquitto, with an ACL that denies
// deniedPrefix and allows every other topic. extra lines go to its
// configuration.
func broker(tb testing.TB, extra ...string) *throwaway.Server {
	tb.Helper()
	return throwaway.Mosquitto(tb, append([]string{"acl_file " + aclFile(tb)}, extra...)...)
}

func aclFile(tb testing.TB) string {
	tb.Helper()
	path := tb.TempDir() + "/acl"
	require.NoError(tb, writeFile(path, "topic deny "+deniedPrefix+"#\ntopic readwrite #\n"))
	return path
}

// testEnv is a topic prefix of its own on a broker, a sink publishing to
// it (through a proxy, so that a test can cut the sink's connections
// without touching the broker) and a subscriber on prefix/#.
type testEnv struct {
	t      testing.TB
	broker *throwaway.Server
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool
	sub    *mqtttest.Subscriber
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

// direct connects the sink straight to the broker (benchmarks).
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

func setup(tb testing.TB, b *throwaway.Server, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, broker: b, prefix: testkit.RandName("t")}
	e.cfg = Config{
		PublishTimeout:   5 * time.Second,
		ConnectTimeout:   2 * time.Second,
		ReconnectInitial: 20 * time.Millisecond,
		ReconnectMax:     200 * time.Millisecond,
		// The Poison message of the conformance harness sets this header
		// to get a topic the ACL denies.
		Topic: "{header:x-test-route}{topic}",
	}
	for _, o := range opts {
		o(e)
	}
	e.sub = mqtttest.Subscribe(tb, b.URL(), e.prefix+"/#", mqtttest.Options{KeepAlive: 30, Reconnect: 20 * time.Millisecond})
	u, err := url.Parse(b.URL())
	require.NoError(tb, err)
	if !e.direct {
		e.proxy = tcpproxy.New(tb, u.Host)
		u.Host = e.proxy.Addr()
	}
	e.cfg.URL = u.String()
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

// topic returns a topic under the env's prefix.
func (e *testEnv) topic(suffix string) string { return e.prefix + "/" + suffix }

func delivered(p *paho.Publish) sinktest.Delivered {
	d := sinktest.Delivered{Topic: p.Topic, Payload: p.Payload, Headers: map[string]string{}, Partition: -1}
	if p.Properties != nil {
		for _, u := range p.Properties.User {
			d.Headers[u.Key] = u.Value
		}
		if p.Properties.ContentType != "" {
			d.Headers[HeaderContentType] = p.Properties.ContentType
		}
	}
	d.ID, d.Key = d.Headers[PropID], d.Headers[PropKey]
	d.Seq, _ = strconv.ParseInt(d.Headers[PropSeq], 10, 64)
	return d
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o644) }
