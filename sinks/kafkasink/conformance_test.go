package kafkasink

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// confPrefix exercises topic_prefix: the suite sees logical topics, Kafka
// sees prefixed ones, and Read maps them back.
const confPrefix = "conformance."

// restartable is a kfake cluster that can be closed and started again on
// the same port with the same data directory, so topics and records survive
// and the sink's connections really break.
type restartable struct {
	mu   sync.Mutex
	c    *kfake.Cluster
	port int
	dir  string
	opts []kfake.Opt // the cluster's options, again at every start
}

func (r *restartable) cluster() *kfake.Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.c
}

func (r *restartable) restart() error {
	r.stop()
	return r.start()
}

// stop closes the cluster: its port refuses connections until start.
func (r *restartable) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.c.Close()
}

// start brings the cluster back on the same port with the same data.
func (r *restartable) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(r.port), kfake.DataDir(r.dir)}, r.opts...)...)
	if err != nil {
		return err
	}
	r.c = c
	return nil
}

// newRestartable starts a cluster (with opts) that can be stopped and
// started again on its port; it is closed when the test ends.
func newRestartable(t *testing.T, opts ...kfake.Opt) *restartable {
	t.Helper()
	dir := t.TempDir()
	first := newCluster(t, append([]kfake.Opt{kfake.DataDir(dir)}, opts...)...)
	_, portStr, err := net.SplitHostPort(first.ListenAddrs()[0])
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	rc := &restartable{c: first, port: port, dir: dir, opts: opts}
	t.Cleanup(func() { rc.cluster().Close() })
	return rc
}

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Partitions: true, Poison: true, Transient: true, Restart: true, Outage: true},
		Setup:    func(t *testing.T) *sinktest.Env { return conformanceEnv(t, nil, nil, nil) },
	})
}

// TestConformanceNotIdempotent runs the suite with the idempotent
// producer off: kafka-go's own produce requests.
func TestConformanceNotIdempotent(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Partitions: true, Poison: true, Transient: true, Restart: true, Outage: true},
		Setup: func(t *testing.T) *sinktest.Env {
			return conformanceEnv(t, nil, func(cfg *Config) { cfg.Idempotent = ptr(false) }, nil)
		},
	})
}

// TestConformanceSASL runs the suite with SCRAM-SHA-512 on: every
// connection the sink opens, also after the broker restarts, authenticates.
func TestConformanceSASL(t *testing.T) {
	t.Parallel()
	const user, pass = "relay", "conformance-s3cret"
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Partitions: true, Poison: true, Transient: true, Restart: true, Outage: true},
		Setup: func(t *testing.T) *sinktest.Env {
			return conformanceEnv(t,
				[]kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", user, pass)},
				func(cfg *Config) { cfg.SASL = SASLConfig{Mechanism: SASLScramSHA512, Username: user, Password: pass} },
				[]kgo.Opt{kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())})
		},
	})
}

// conformanceEnv starts a restartable cluster with opts, a sink configured
// by mod and a consumer with consOpts.
func conformanceEnv(t *testing.T, opts []kfake.Opt, mod func(*Config), consOpts []kgo.Opt) *sinktest.Env {
	rc := newRestartable(t, opts...)
	first := rc.cluster()

	s := newSink(t, first, func(cfg *Config) {
		cfg.TopicPrefix = confPrefix
		cfg.DialTimeout = 2 * time.Second
		if mod != nil {
			mod(cfg)
		}
	})
	cons := newConsumerWith(t, first.ListenAddrs(), consOpts)

	return &sinktest.Env{
		Sink: s,
		Topic: func(suffix string) string {
			logical := "t." + suffix
			require.NoError(t, rc.cluster().CreateTopic(confPrefix+logical, 3, nil))
			return logical
		},
		Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
			recs, err := cons.read(ctx, n)
			out := make([]sinktest.Delivered, 0, len(recs))
			for _, r := range recs {
				d := sinktest.Delivered{
					Topic:     strings.TrimPrefix(r.Topic, confPrefix),
					Key:       string(r.Key),
					Payload:   r.Value,
					Headers:   map[string]string{},
					Partition: int(r.Partition),
				}
				for _, h := range r.Headers {
					if h.Key == HeaderMessageID {
						d.ID = string(h.Value)
						continue
					}
					if h.Key == HeaderSeq {
						d.Seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
						continue
					}
					d.Headers[h.Key] = string(h.Value)
				}
				out = append(out, d)
			}
			return out, err
		},
		Poison: func(topic string) sinks.Message {
			// Bigger than max_message_bytes (and the broker's default
			// message.max.bytes): refused before any round trip.
			return sinktest.Msg(topic, "", 0, make([]byte, DefaultMaxMessageBytes+1))
		},
		BreakTransient: func() func() {
			// Every produce is answered NOT_LEADER_FOR_PARTITION, nothing
			// appended, until restore.
			return failProduce(rc.cluster(), kerr.NotLeaderForPartition.Code)
		},
		Restart: rc.restart,
		// The broker stops: its port refuses connections until Up.
		Down: func() error { rc.stop(); return nil },
		Up:   rc.start,
	}
}
