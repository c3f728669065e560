package mqttsink

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
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
	sub    *subscriber
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
	e.sub = subscribe(tb, b.URL(), e.prefix+"/#", 0)
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

// subscriber is a paho client subscribed with QoS 1 to one filter, which
// keeps what arrives in arrival order. With a session expiry it keeps its
// session across reconnections (a broker with persistence keeps it across
// its restarts).
type subscriber struct {
	cm   *autopaho.ConnectionManager
	mu   sync.Mutex
	got  []*paho.Publish
	next int
	more chan struct{} // signalled on each arrival
}

func subscribe(tb testing.TB, brokerURL, filter string, sessionExpiry uint32) *subscriber {
	tb.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(tb, err)
	s := &subscriber{more: make(chan struct{}, 1)}
	subscribed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:            []*url.URL{u},
		KeepAlive:             30,
		SessionExpiryInterval: sessionExpiry,
		ReconnectBackoff:      func(int) time.Duration { return 20 * time.Millisecond },
		ConnectTimeout:        2 * time.Second,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
			go func() {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_, err := cm.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
				select {
				case subscribed <- err:
				default:
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: testkit.RandName("sub"),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				s.mu.Lock()
				s.got = append(s.got, pr.Packet)
				s.mu.Unlock()
				select {
				case s.more <- struct{}{}:
				default:
				}
				return true, nil
			}},
		},
	})
	require.NoError(tb, err)
	s.cm = cm
	tb.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = cm.Disconnect(dctx)
		cancel()
		<-cm.Done()
	})
	select {
	case err := <-subscribed:
		require.NoError(tb, err, "subscribe to %s", filter)
	case <-time.After(15 * time.Second):
		tb.Fatalf("subscriber: not subscribed to %s on %s after 15s", filter, brokerURL)
	}
	return s
}

// read returns the next n messages that arrived.
func (s *subscriber) read(ctx context.Context, n int) ([]*paho.Publish, error) {
	for {
		s.mu.Lock()
		if len(s.got)-s.next >= n {
			out := s.got[s.next : s.next+n]
			s.next += n
			s.mu.Unlock()
			return out, nil
		}
		have := len(s.got) - s.next
		s.mu.Unlock()
		select {
		case <-s.more:
		case <-ctx.Done():
			return nil, fmt.Errorf("read %d of %d messages: %w", have, n, ctx.Err())
		}
	}
}

// all returns every message that arrived so far.
func (s *subscriber) all() []*paho.Publish {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*paho.Publish(nil), s.got...)
}

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
