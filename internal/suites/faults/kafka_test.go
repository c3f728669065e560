package faults

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/testkit/kafkatest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
)

// kafkaRig is an in-process Kafka (kfake) with a consumer that records
// every record of the given topics.
type kafkaRig struct {
	c      *kfake.Cluster
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	failOn atomic.Int32 // error code every produce gets while non-zero
	dir    string       // the broker's data, for a restart on the same port
	port   int

	mu    sync.Mutex
	got   []delivery
	stamp []time.Time // record timestamps, by position in got
}

func newKafkaRig(t testing.TB, topics []string, opts ...kfake.Opt) *kafkaRig {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topics...)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake cluster: %v", err)
	}
	k := &kafkaRig{c: c, done: make(chan struct{})}
	// Every produce request is answered with failOn's code on every
	// partition while failOn is set: the broker is up but refuses writes.
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		code := int16(k.failOn.Load())
		if code == 0 {
			return nil, nil, false
		}
		return kafkatest.Refuse(kreq, code), nil, true
	})
	k.cl, err = kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(32<<20))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() {
		defer close(k.done)
		for ctx.Err() == nil {
			fs := k.cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				d := delivery{Topic: r.Topic, Key: string(r.Key), Payload: string(r.Value), At: time.Now(), Header: map[string][]string{}}
				for _, h := range r.Headers {
					d.Header[h.Key] = append(d.Header[h.Key], string(h.Value))
					if h.Key == kafkasink.HeaderMessageID {
						d.ID = string(h.Value)
					}
				}
				k.mu.Lock()
				k.got = append(k.got, d)
				k.stamp = append(k.stamp, r.Timestamp)
				k.mu.Unlock()
			})
		}
	}()
	t.Cleanup(k.close)
	return k
}

func (k *kafkaRig) close() {
	k.cancel()
	<-k.done
	k.cl.Close()
	k.c.Close()
}

func (k *kafkaRig) deliveries() []delivery {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]delivery(nil), k.got...)
}

// timestamps returns the record timestamp of every delivery, by payload
// (the last one of a payload delivered twice).
func (k *kafkaRig) timestamps() map[string]time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]time.Time, len(k.got))
	for i, d := range k.got {
		out[d.Payload] = k.stamp[i]
	}
	return out
}

func (k *kafkaRig) broker() string { return k.c.ListenAddrs()[0] }

// newRestartableKafkaRig is newKafkaRig with a broker that stopBroker and
// startBroker can take down and bring back on the same port, with its
// topics and records. failOn acts on the first broker only.
func newRestartableKafkaRig(t testing.TB, topics []string) *kafkaRig {
	t.Helper()
	dir := t.TempDir()
	k := newKafkaRig(t, topics, kfake.DataDir(dir))
	_, port, err := net.SplitHostPort(k.broker())
	require.NoError(t, err)
	k.dir = dir
	k.port, err = strconv.Atoi(port)
	require.NoError(t, err)
	return k
}

// stopBroker closes the broker: connections to its port are refused.
func (k *kafkaRig) stopBroker() { k.c.Close() }

// startBroker brings the broker back on its port with its data.
func (k *kafkaRig) startBroker(t testing.TB) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(k.port), kfake.DataDir(k.dir))
	require.NoError(t, err)
	k.c = c
}

func (k *kafkaRig) sink(t testing.TB, mod func(*kafkasink.Config)) *kafkasink.Sink {
	t.Helper()
	cfg := kafkasink.Config{Brokers: k.c.ListenAddrs(), WriteTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := kafkasink.New(cfg, nil)
	require.NoError(t, err)
	return s
}

// reconnectCap is the longest pause of a relay worker between two cycles
// that failed (relay.newReconnectBackoff: 5 s, randomized by ±50 %).
const reconnectCap = 7500 * time.Millisecond

// TestSinkOutageKafkaBrokerDown stops the broker (its port refuses
// connections) for outageLength() while writers keep committing, with the
// relay's default retry backoff (1 s doubling, up to 10 min), then starts
// it again on the same port.
//
// Nothing can be sent to a broker that cannot be dialled, and the sink
// says so (sinks.ErrNotAttempted): the rows are left as they are, with no
// attempt counted and no retry time stored, and the workers back off (at
// most reconnectCap) and claim them again. Only the requests on the wire
// when the broker went away count an attempt. Asserted: no attempt counted
// after those; when the broker comes back no row waits for a retry time
// more than RetryInitial ahead; delivery resumes within reconnectCap (plus
// slack). Before the fix every message written during the outage was
// rescheduled in its row with exponential backoff, and after a 30 s
// outage the last rows were due 39 s after the broker was back.
func TestSinkOutageKafkaBrokerDown(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	k := newRestartableKafkaRig(t, []string{"orders"})
	cfg := relay.Config{Workers: 2, BatchSize: 200, MaxAttempts: 1000}
	cs := newCountingSink(k.sink(t, func(c *kafkasink.Config) { c.DialTimeout = time.Second }))
	p := runInproc(t, pgtest.URL(), schema, cs, cfg)
	w := startSteadyWriter(t, pool, schema, nil)

	eventually(t, 20*time.Second, 20*time.Millisecond, func() (bool, string) {
		return len(k.deliveries()) >= 100, "waiting for the first deliveries"
	})
	k.stopBroker()
	downAt := time.Now()
	w.writeMore(t, outageWrites(), nil)
	outage := time.Since(downAt)
	backlog := count(t, pool, schema, "messages")
	// How long the rows would still wait, by their stored retry times, if
	// the broker came back now.
	var wait pgtype.Interval
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(max(available_at) - clock_timestamp(), '0')
		FROM `+migrations.Ident(schema)+`.messages`).Scan(&wait))
	rowWait := max(0, time.Duration(wait.Microseconds)*time.Microsecond)
	k.startBroker(t)
	upAt := time.Now()
	delivered := len(k.deliveries())
	// The writer goes on until the broker takes deliveries again.
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		return len(k.deliveries()) > delivered, "no delivery since the broker came back"
	})
	want := w.stop()

	var resumed, emptied, drained time.Duration
	eventually(t, 60*time.Second+outage, 50*time.Millisecond, func() (bool, string) {
		if resumed == 0 && len(k.deliveries()) > delivered {
			resumed = time.Since(upAt)
		}
		left := count(t, pool, schema, "messages")
		if left == 0 && emptied == 0 {
			emptied = time.Since(upAt)
		}
		if left == 0 && distinct(k.deliveries()) >= len(want) {
			drained = time.Since(upAt)
			return true, ""
		}
		return false, fmt.Sprintf("%d pending, %d of %d delivered", left, distinct(k.deliveries()), len(want))
	})
	got := k.deliveries()
	dups := checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")
	// Attempts counted while the broker was down, past the moment it went
	// away: once the requests on the wire and on the connections already
	// open have failed, the sink dials, and the first Send that could not
	// reach the broker (it attempted none of its messages) says so. From
	// then on no Send may count an attempt.
	failedAt := cs.firstUnreached(downAt)
	require.False(t, failedAt.IsZero(), "no Send found the broker unreachable while it was down")
	onTheWire := failedAt.Sub(downAt).Round(time.Millisecond)
	during, worst := 0, 0
	for _, ts := range cs.attempts() {
		worst = max(worst, len(ts))
		for _, at := range ts {
			if at.After(failedAt) && at.Before(upAt) {
				during++
			}
		}
	}
	st := p.r.Stats()
	failedCycles := p.logs.Count("batch failed; retrying")
	t.Logf("broker down %s (backlog %d, the last row's retry time %s ahead): delivery resumed %s (bound %s), the outbox was empty %s and the consumer had everything %s after it came back; "+
		"%d written, %d duplicates; %d attempts counted while it was down (after the first %s), worst %d attempts for a message; "+
		"%d retries scheduled in rows, %d failed cycles",
		upAt.Sub(downAt).Round(time.Millisecond), backlog, rowWait.Round(time.Millisecond),
		resumed.Round(time.Millisecond), reconnectCap+5*time.Second, emptied.Round(time.Millisecond), drained.Round(time.Millisecond),
		len(want), dups, during, onTheWire, worst, st.Retried, failedCycles)
	require.Zero(t, during, "attempts counted (and rows rescheduled) while the broker could not be dialled")
	// The rows on the wire when the broker went away wait RetryInitial
	// (1 s ±20 %) once; nothing else may have been pushed back.
	require.LessOrEqual(t, rowWait, 1200*time.Millisecond, "rows rescheduled past the recovery while the broker could not be dialled")
	// The time to drain the backlog depends on the machine; the time until
	// the relay tries again does not.
	require.Less(t, resumed, reconnectCap+5*time.Second, "delivery did not resume within the workers' backoff")
}
