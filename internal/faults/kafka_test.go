package faults

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
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
