package pubsubsink

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pstest's and the client's gRPC machinery keep goroutines of
		// their own past Close (OpenCensus' view worker, gRPC's callback
		// serializer).
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

const project = "outbox-test"

// testEnv is an in-process Pub/Sub fake (pstest) of its own, reached
// through a proxy so that a test can cut or refuse the sink's
// connections, and a sink publishing to it.
type testEnv struct {
	t      testing.TB
	srv    *pstest.Server
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	prefix string

	mu   sync.Mutex
	read int // messages of srv.Messages() already returned by read
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

func setup(tb testing.TB, opts ...envOpt) *testEnv {
	tb.Helper()
	srv := pstest.NewServerWithAddress("127.0.0.1:0")
	tb.Cleanup(func() { _ = srv.Close() })
	e := &testEnv{t: tb, srv: srv, prefix: testkit.RandName("t")}
	e.proxy = tcpproxy.New(tb, srv.Addr)
	e.cfg = Config{
		Project: project,
		// The conformance suite's poison sets this header to publish to a
		// topic that does not exist.
		Topic:          "{header:x-test-route}{topic}",
		Endpoint:       e.proxy.Addr(),
		Insecure:       true,
		PublishTimeout: 10 * time.Second,
	}
	for _, o := range opts {
		o(e)
	}
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

// topic creates a topic and returns its ID.
func (e *testEnv) topic(suffix string) string {
	e.t.Helper()
	id := e.prefix + "-" + suffix
	_, err := e.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + id})
	require.NoError(e.t, err)
	return id
}

// readNew returns the messages the fake stored since the last call, in
// publish order.
func (e *testEnv) readNew(n int) []*pstest.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	all := e.srv.Messages()
	out := all[e.read:min(len(all), e.read+n)]
	e.read += len(out)
	return out
}

func delivered(m *pstest.Message) sinktest.Delivered {
	d := sinktest.Delivered{Topic: m.Topic[strings.LastIndexByte(m.Topic, '/')+1:], Key: m.OrderingKey, Payload: m.Data,
		Headers: map[string]string{}, Partition: -1}
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	for k, v := range m.Attributes {
		switch k {
		case AttrID:
			d.ID = v
		case AttrSeq:
			d.Seq, _ = strconv.ParseInt(v, 10, 64)
		case AttrKey:
		default:
			d.Headers[k] = v
		}
	}
	return d
}

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			Why: map[string]string{"Partitions": "a Pub/Sub topic has no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t)
			return &sinktest.Env{
				Sink:  e.sink,
				Topic: e.topic,
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					var out []sinktest.Delivered
					for len(out) < n {
						ms := e.readNew(n - len(out))
						for _, m := range ms {
							out = append(out, delivered(m))
						}
						if len(ms) > 0 {
							continue
						}
						select {
						case <-ctx.Done():
							return out, ctx.Err()
						case <-time.After(5 * time.Millisecond):
						}
					}
					return out, nil
				},
				Poison: func(topic string) sinks.Message {
					// To a topic that does not exist: NotFound.
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": "missing-"}
					return m
				},
				BreakTransient: e.proxy.Break,
				Restart:        e.proxy.Restart,
				Down:           e.proxy.Down,
				Up:             e.proxy.Up,
			}
		},
	})
}

// TestFailedKeyResumes: a key whose publish failed stops in that Send
// (its later messages not attempted, never stored), other keys go on, and
// the key publishes again in the next Send (the sink resumed it).
func TestFailedKeyResumes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topic := e.topic("resume")
	// The fake answers the next Publish RPC with Unavailable while
	// connected: a retriable failure of whichever bundle goes first.
	e.srv.SetAutoPublishResponse(false)
	e.srv.AddPublishResponse(nil, status.Error(codes.Unavailable, "injected"))
	a1, a2 := sinktest.Msg(topic, "a", 1, []byte("a1")), sinktest.Msg(topic, "a", 2, []byte("a2"))
	err := e.sink.Send(ctx, []sinks.Message{a1, a2})
	e.srv.SetAutoPublishResponse(true)
	require.Error(t, sinks.Outcome(err, 0, 2))
	require.False(t, sinks.IsPermanent(sinks.Outcome(err, 0, 2)))
	require.False(t, errors.Is(sinks.Outcome(err, 0, 2), sinks.ErrNotAttempted), "connected: the RPC was sent")
	// a2 failed with a1: in the same request, or not sent after it.
	require.Error(t, sinks.Outcome(err, 1, 2), "a2 after the failed a1")
	require.Empty(t, e.readNew(10), "nothing stored")
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{a1, a2}), "the key was resumed")
	got := e.readNew(10)
	require.Len(t, got, 2)
	require.Equal(t, "a1", string(got[0].Data))
	require.Equal(t, "a", got[0].OrderingKey)
}

// TestRefusedBeforeSending: what Pub/Sub would refuse for the message
// itself is dead-lettered with the reason, and stops only its key.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topic := e.topic("refused")
	for _, c := range []struct {
		mod  func(m *sinks.Message)
		want string
	}{
		{func(m *sinks.Message) { m.Headers = map[string]string{"googx": "v"} }, `"goog"`},
		{func(m *sinks.Message) { m.Headers = map[string]string{"x": strings.Repeat("v", 2000)} }, "at most 1024"},
		{func(m *sinks.Message) { m.Headers = map[string]string{AttrID: "forged"} }, "sink's own"},
		{func(m *sinks.Message) { m.Payload = make([]byte, MaxMessageBytes) }, "above Pub/Sub's"},
	} {
		bad := sinktest.Msg(topic, "k", 1, []byte("x"))
		c.mod(&bad)
		batch := []sinks.Message{bad, sinktest.Msg(topic, "k", 2, []byte("after")), sinktest.Msg(topic, "other", 3, []byte("other"))}
		err := e.sink.Send(ctx, batch)
		be := &sinks.BatchError{}
		require.ErrorAs(t, err, &be, c.want)
		require.True(t, sinks.IsPermanent(be.Errs[0]), "%s: %v", c.want, be.Errs[0])
		require.ErrorIs(t, be.Errs[0], ErrInvalid)
		require.ErrorContains(t, be.Errs[0], c.want)
		require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted, c.want)
		require.NoError(t, be.Errs[2], c.want)
	}
}

// TestRefusedConnectionIsNotAttempted: an endpoint that refuses
// connections costs no attempt; the sink publishes again once it is back.
func TestRefusedConnectionIsNotAttempted(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.PublishTimeout = 3 * time.Second }))
	ctx := context.Background()
	topic := e.topic("down")
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "k", 1, []byte("x"))}))
	restore := e.proxy.Break()
	batch := []sinks.Message{sinktest.Msg(topic, "k", 2, []byte("y")), sinktest.Msg(topic, "", 3, []byte("z"))}
	var err error
	for range 5 { // the connection cut under a Send, or not yet seen as gone, is an attempt
		if err = e.sink.Send(ctx, batch); errors.Is(sinks.Outcome(err, 0, 2), sinks.ErrNotAttempted) {
			break
		}
	}
	for i := range batch {
		require.ErrorIs(t, sinks.Outcome(err, i, 2), sinks.ErrNotAttempted, "%v", err)
	}
	restore()
	require.Eventually(t, func() bool { return e.sink.Send(ctx, batch) == nil }, 20*time.Second, 50*time.Millisecond)
}

// TestRedialsOnItsOwnBackoff: while the endpoint refuses connections the
// client redials on reconnect_initial..reconnect_max, not on gRPC's
// default that grows to two minutes (1 s, 1.6 s, 2.6 s, ...: 5 dials in
// 20 s), so a long outage's end is seen within reconnect_max.
func TestRedialsOnItsOwnBackoff(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) {
		c.PublishTimeout = 3 * time.Second
		c.ReconnectInitial, c.ReconnectMax = 50*time.Millisecond, 200*time.Millisecond
	}))
	ctx := context.Background()
	topic := e.topic("redial")
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "k", 1, []byte("x"))}))
	restore := e.proxy.Break()
	from := e.sink.dials.dials.Load()
	// A Send makes the client see the connection gone; the dials that
	// follow are the backoff's.
	_ = e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "k", 2, []byte("y"))})
	var dials int64
	redialing := func() bool {
		if dials = e.sink.dials.dials.Load() - from; dials == 0 {
			// Not seen as gone yet (under load the Send above may have
			// been answered before the break took): another Send sees it.
			_ = e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "k", 2, []byte("y"))})
		}
		return dials >= 12
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if !testkit.Poll(pctx, 20*time.Millisecond, redialing) {
		t.Fatalf("%d dials in 20 s while the endpoint refused connections; want 12 on a 50-200 ms backoff", dials)
	}
	restore()
	require.Eventually(t, func() bool {
		return e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "k", 2, []byte("y"))}) == nil
	}, 20*time.Second, 50*time.Millisecond)
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("pubsub://my-project?topic=events.{topic}&endpoint=us-east1-pubsub.googleapis.com:443&credentials_file=/sa.json")
	require.NoError(t, err)
	require.Equal(t, Config{Project: "my-project", Topic: "events.{topic}", Endpoint: "us-east1-pubsub.googleapis.com:443", CredentialsFile: "/sa.json"}, c)
	require.Equal(t, "pubsub://my-project?credentials_file=xxxxx&endpoint=us-east1-pubsub.googleapis.com%3A443&topic=events.%7Btopic%7D", c.Redacted())
	for raw, want := range map[string]string{
		"pubsub://p?bogus=1":         "unknown sink URL parameter",
		"pubsub://":                  "project: required",
		"pubsub://p/x":               "want pubsub://PROJECT",
		"pubsub://p?topic={nope}":    "topic: unknown placeholder",
		"pubsub://p?endpoint=nohost": "endpoint: want host:port",
		"pubsub://p?insecure=true&credentials_file=/a.json": "insecure:",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: pubsub: "), err.Error())
	}
}
