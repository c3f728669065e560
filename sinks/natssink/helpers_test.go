package natssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEnv is a stream of its own on a server, covering prefix.>, a sink
// publishing to it (through a proxy, so that a test can cut the sink's
// connections without touching the server), and a reader.
type testEnv struct {
	t      testing.TB
	server string // the server: TEST_NATS_URL unless onServer
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool   // the sink connects to the server, not through the proxy
	next   uint64 // next stream sequence Read returns
	scfg   jetstream.StreamConfig
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }
func withStream(f func(*jetstream.StreamConfig)) envOpt {
	return func(e *testEnv) { f(&e.scfg) }
}

// direct connects the sink straight to the server (benchmarks: the proxy
// would be a cost the raw publisher does not pay).
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

func onServer(u string) envOpt { return func(e *testEnv) { e.server = u } }

func setup(tb testing.TB, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, server: testkit.NATSURL(), name: testkit.RandName("OUTBOXTEST_"), prefix: testkit.RandName("t"), next: 1}
	e.scfg = jetstream.StreamConfig{Storage: jetstream.MemoryStorage, Duplicates: 2 * time.Minute}
	e.cfg = Config{
		PublishTimeout:   10 * time.Second,
		DialTimeout:      2 * time.Second,
		ReconnectInitial: 20 * time.Millisecond,
		ReconnectMax:     200 * time.Millisecond,
		// The Poison message of the conformance harness sets this header
		// to get a subject no stream covers.
		Subject: "{header:x-test-route}{topic}",
	}
	for _, o := range opts {
		o(e)
	}
	e.scfg.Name = e.name
	e.scfg.Subjects = []string{e.prefix + ".>"}
	nc, err := nats.Connect(e.server, nats.Timeout(2*time.Second))
	if err != nil {
		if e.server == testkit.NATSURL() {
			testkit.Unavailable(tb, "service", "NATS not reachable at TEST_NATS_URL (%s): %v", e.server, err)
		}
		require.NoError(tb, err)
	}
	tb.Cleanup(nc.Close)
	e.nc = nc
	e.js, err = jetstream.New(nc)
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.stream, err = e.js.CreateStream(ctx, e.scfg)
	if err != nil && e.server == testkit.NATSURL() {
		testkit.Unavailable(tb, "service", "JetStream not enabled at TEST_NATS_URL (%s): %v", e.server, err)
	}
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.js.DeleteStream(ctx, e.name); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			tb.Logf("cleanup: delete stream %s: %v", e.name, err)
		}
	})
	u, err := url.Parse(e.server)
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

// topic returns a topic the env's stream covers.
func (e *testEnv) topic(suffix string) string {
	return e.prefix + "." + strings.NewReplacer(".", "_", " ", "_", "*", "_", ">", "_").Replace(suffix)
}

// read returns the next n messages of the stream, in stream order.
func (e *testEnv) read(ctx context.Context, n int) ([]*jetstream.RawStreamMsg, error) {
	var out []*jetstream.RawStreamMsg
	for len(out) < n {
		m, err := e.stream.GetMsg(ctx, e.next)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("read %d of %d messages: %w", len(out), n, ctx.Err())
			case <-time.After(5 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return out, fmt.Errorf("read %d of %d messages: %w", len(out), n, err)
		}
		e.next++
		out = append(out, m)
	}
	return out, nil
}

// count returns the number of messages in the stream.
func (e *testEnv) count(ctx context.Context) uint64 {
	e.t.Helper()
	info, err := e.stream.Info(ctx)
	require.NoError(e.t, err)
	return info.State.Msgs
}

func delivered(m *jetstream.RawStreamMsg) sinktest.Delivered {
	seq, _ := strconv.ParseInt(m.Header.Get(HeaderSeq), 10, 64)
	d := sinktest.Delivered{ID: m.Header.Get(HeaderMsgID), Seq: seq, Topic: m.Subject, Key: m.Header.Get(HeaderKey),
		Payload: m.Data, Headers: map[string]string{}, Partition: -1}
	for k, v := range m.Header {
		if len(v) > 0 {
			d.Headers[k] = v[0]
		}
	}
	return d
}

// fillStream makes the stream refuse new messages (discard new at its
// current count) until restore.
func (e *testEnv) fillStream() (restore func()) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := e.scfg
	cfg.Discard = jetstream.DiscardNew
	cfg.MaxMsgs = int64(max(e.count(ctx), 1))
	_, err := e.js.UpdateStream(ctx, cfg)
	require.NoError(e.t, err)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := e.js.UpdateStream(ctx, e.scfg)
		require.NoError(e.t, err)
	}
}
