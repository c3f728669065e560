package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newCluster starts an in-process Kafka (kfake) on loopback. kfake cannot be
// unreachable, but a failure to listen is reported the way the house rules
// want for a missing backend.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		testkit.Unavailable(t, "service", "kfake cluster cannot start on loopback: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t testing.TB, c *kfake.Cluster, mod ...func(*Config)) *Sink {
	t.Helper()
	cfg := Config{Brokers: c.ListenAddrs(), WriteTimeout: 5 * time.Second}
	for _, f := range mod {
		f(&cfg)
	}
	s, err := New(cfg, testkit.Logger(t, slog.LevelDebug))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Close(ctx))
	})
	return s
}

// consumer reads records back with franz-go, a client independent of the
// one under test.
type consumer struct {
	cl *kgo.Client
	mu sync.Mutex
}

// newConsumer consumes topics, or with none every topic matching the
// regular expression consumeAll (found as they are created).
func newConsumer(t testing.TB, addrs []string, topics ...string) *consumer {
	t.Helper()
	return newConsumerWith(t, addrs, nil, topics...)
}

// newConsumerWith is newConsumer with more client options (SASL, TLS).
func newConsumerWith(t testing.TB, addrs []string, opts []kgo.Opt, topics ...string) *consumer {
	t.Helper()
	consume := kgo.ConsumeTopics(topics...)
	if len(topics) == 0 {
		consume = kgo.ConsumeRegex()
		topics = []string{consumeAll}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(addrs...),
		kgo.ConsumeTopics(topics...),
		consume,
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.MetadataMinAge(50 * time.Millisecond),
		kgo.MetadataMaxAge(200 * time.Millisecond),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &consumer{cl: cl}
}

const consumeAll = `^[^_].*` // not kfake's internal __consumer_offsets and the like

// read returns the next n records; per partition they are in offset order.
func (c *consumer) read(ctx context.Context, n int) ([]*kgo.Record, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*kgo.Record
	for len(out) < n {
		fs := c.cl.PollRecords(ctx, n-len(out))
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("consumer: read %d of %d records: %w", len(out), n, err)
		}
		for _, e := range fs.Errors() {
			if !errors.Is(e.Err, context.DeadlineExceeded) && !errors.Is(e.Err, context.Canceled) {
				return out, e.Err
			}
		}
		out = append(out, fs.Records()...)
	}
	return out, nil
}

func (c *consumer) mustRead(t testing.TB, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	recs, err := c.read(ctx, n)
	require.NoError(t, err)
	return recs
}

// readNothingMore checks that no further record arrives within d. Absence
// can only be observed by waiting; d is short.
func (c *consumer) readNothingMore(t testing.TB, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	recs, _ := c.read(ctx, 1)
	require.Empty(t, recs, "unexpected extra records")
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func msg(topic, key string, seq int64, payload string) sinks.Message {
	return sinktest.Msg(topic, key, seq, []byte(payload))
}

// outcome returns the per-message error of a Send.
func outcome(err error, i, n int) error { return sinks.Outcome(err, i, n) }

// murmur2Partition is the partition the Java client (and kgo's default key
// partitioner) picks for key among n partitions.
func murmur2Partition(topic, key string, n int) int32 {
	p := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	return int32(p.Partition(&kgo.Record{Key: []byte(key)}, n))
}
