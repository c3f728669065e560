package redissink

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEnv is a key prefix of its own on a server, a sink writing under it
// (through a proxy, so that a test can cut the sink's connections without
// touching the server) and a reader of one stream at a time.
type testEnv struct {
	t      testing.TB
	server string
	rdb    *redis.Client
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool              // the sink connects to the server, not through the proxy
	last   map[string]string // stream -> last entry id read
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

// direct connects the sink straight to the server (benchmarks: the proxy
// would be a cost the raw publisher does not pay).
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

func onServer(u string) envOpt { return func(e *testEnv) { e.server = u } }

func setup(tb testing.TB, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, server: testkit.RedisURL(), prefix: testkit.RandName("outboxtest:"), last: map[string]string{}}
	e.cfg = Config{
		PublishTimeout: 10 * time.Second,
		DialTimeout:    2 * time.Second,
		// The Poison message of the conformance harness sets this header
		// to write to a key that holds a string (WRONGTYPE).
		Stream: "{header:x-test-route}{topic}",
	}
	for _, o := range opts {
		o(e)
	}
	ropts, err := redis.ParseURL(e.server)
	require.NoError(tb, err)
	ropts.DisableIdentity = true
	e.rdb = redis.NewClient(ropts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		_ = e.rdb.Close()
		if e.server == testkit.RedisURL() {
			testkit.Unavailable(tb, "service", "Redis not reachable at TEST_REDIS_URL (%s): %v", e.server, err)
		}
		require.NoError(tb, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := e.rdb.Scan(ctx, 0, e.prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			e.rdb.Del(ctx, iter.Val())
		}
		_ = e.rdb.Close()
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

func (e *testEnv) topic(suffix string) string { return e.prefix + ":" + suffix }

// read returns the next n entries of stream.
func (e *testEnv) read(ctx context.Context, stream string, n int) ([]redis.XMessage, error) {
	var out []redis.XMessage
	for len(out) < n {
		last := e.last[stream]
		if last == "" {
			last = "0"
		}
		res, err := e.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: int64(n - len(out)), Block: 50 * time.Millisecond}).Result()
		if err == redis.Nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("read %d of %d entries: %w", len(out), n, ctx.Err())
			}
			continue
		}
		if err != nil {
			return out, fmt.Errorf("read %d of %d entries: %w", len(out), n, err)
		}
		for _, st := range res {
			for _, m := range st.Messages {
				out = append(out, m)
				e.last[stream] = m.ID
			}
		}
	}
	return out, nil
}

func delivered(topic string, m redis.XMessage) sinktest.Delivered {
	d := sinktest.Delivered{Topic: topic, Headers: map[string]string{}, Partition: -1}
	for k, v := range m.Values {
		s, _ := v.(string)
		switch k {
		case FieldID:
			d.ID = s
		case FieldSeq:
			d.Seq, _ = strconv.ParseInt(s, 10, 64)
		case FieldKey:
			d.Key = s
		case FieldPayload:
			d.Payload = []byte(s)
		default:
			d.Headers[k] = s
		}
	}
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	return d
}
