package kafkasink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/testkit/kafkatest"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// failProduce makes every produce request fail with code on every
// partition (through kfake's ControlKey) until the returned restore is
// called. Nothing is appended while it is in force.
func failProduce(c *kfake.Cluster, code int16) (restore func()) {
	var stopped atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if stopped.Load() {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		return kafkatest.Refuse(kreq, code), nil, true
	})
	return func() { stopped.Store(true) }
}

func TestSendRecordsKeysHeadersPartitions(t *testing.T) {
	t.Parallel()
	const parts = 8
	c := newCluster(t, kfake.SeedTopics(parts, "orders"))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "orders")

	var msgs []sinks.Message
	for i := range 200 {
		key := fmt.Sprintf("k%d", i%17)
		m := msg("orders", key, int64(i), fmt.Sprintf("payload-%d", i))
		m.Headers = map[string]string{"b": "2", "a": "1", "trace": key}
		msgs = append(msgs, m)
	}
	unkeyed := msg("orders", "", 1000, "")
	unkeyed.Payload = nil // delivered as an empty value, never a tombstone
	msgs = append(msgs, unkeyed)
	binary := msg("orders", "bin", 1001, "")
	binary.Payload = []byte{0, 0xff, 0x10, 0}
	msgs = append(msgs, binary)

	require.NoError(t, s.Send(context.Background(), msgs))

	recs := cons.mustRead(t, len(msgs))
	byID := map[string]sinks.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	lastSeq := map[string]int64{}
	for _, r := range recs {
		id, ok := header(r, HeaderMessageID)
		require.True(t, ok, "record without %s header", HeaderMessageID)
		m, ok := byID[id]
		require.True(t, ok)
		delete(byID, id)
		require.Equal(t, HeaderMessageID, r.Headers[0].Key, "the id header comes first")
		require.Equal(t, kgo.RecordHeader{Key: HeaderSeq, Value: strconv.AppendInt(nil, m.Seq, 10)}, r.Headers[1], "the position comes second")
		var keys []string
		for _, h := range r.Headers[2:] {
			keys = append(keys, h.Key)
			require.Equal(t, m.Headers[h.Key], string(h.Value))
		}
		require.Len(t, keys, len(m.Headers))
		require.IsIncreasing(t, keys, "application headers are sorted by key")
		require.True(t, bytes.Equal(m.Payload, r.Value), "payload byte for byte")
		require.NotNil(t, r.Value, "value is never null")
		if m.Key == "" {
			require.Nil(t, r.Key, "no key => null key")
			continue
		}
		require.Equal(t, m.Key, string(r.Key))
		require.Equal(t, murmur2Partition("orders", m.Key, parts), r.Partition, "murmur2 like the Java client")
		if prev, ok := lastSeq[m.Key]; ok {
			require.Greater(t, m.Seq, prev, "per-key order")
		}
		lastSeq[m.Key] = m.Seq
	}
	require.Empty(t, byID, "every message delivered once")
}

// The relay's id wins over an application header of the same name: a
// consumer deduplicating on it must see the stable id.
func TestMessageIDHeaderCannotBeOverridden(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "t")
	m := msg("t", "k", 1, "x")
	m.Headers = map[string]string{HeaderMessageID: "forged", HeaderSeq: "999", "z": "1"}
	require.NoError(t, s.Send(context.Background(), []sinks.Message{m}))
	r := cons.mustRead(t, 1)[0]
	require.Len(t, r.Headers, 3)
	require.Equal(t, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(m.ID)}, r.Headers[0])
	require.Equal(t, kgo.RecordHeader{Key: HeaderSeq, Value: []byte("1")}, r.Headers[1])
	require.Equal(t, "z", r.Headers[2].Key)
}

func TestBalancers(t *testing.T) {
	t.Parallel()
	for _, b := range []string{BalancerCRC32, BalancerFNV1a} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kfake.SeedTopics(6, "t"))
			s := newSink(t, c, func(cfg *Config) { cfg.Balancer = b })
			cons := newConsumer(t, c.ListenAddrs(), "t")
			var msgs []sinks.Message
			for i := range 60 {
				msgs = append(msgs, msg("t", fmt.Sprintf("key-%d", i%6), int64(i), "x"))
			}
			require.NoError(t, s.Send(context.Background(), msgs))
			part := map[string]int32{}
			for _, r := range cons.mustRead(t, len(msgs)) {
				if p, ok := part[string(r.Key)]; ok {
					require.Equal(t, p, r.Partition, "same key, same partition")
				}
				part[string(r.Key)] = r.Partition
			}
		})
	}
}

// A message above max_message_bytes fails permanently without a round trip;
// later messages of its key are not attempted; other keys are delivered.
func TestTooLargeLocally(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(3, "t"))
	s := newSink(t, c, func(cfg *Config) { cfg.MaxMessageBytes = 1000 })
	cons := newConsumer(t, c.ListenAddrs(), "t")
	produces := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})

	big := msg("t", "a", 2, strings.Repeat("x", 2000))
	err := s.Send(context.Background(), []sinks.Message{big})
	require.True(t, sinks.IsPermanent(outcome(err, 0, 1)), "got %v", err)
	require.ErrorIs(t, outcome(err, 0, 1), kafka.MessageSizeTooLarge)
	require.Zero(t, produces.Hits(), "no round trip for a message known to be too large")

	msgs := []sinks.Message{msg("t", "a", 1, "first"), big, msg("t", "a", 3, "after"), msg("t", "b", 4, "other")}
	err = s.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.True(t, sinks.IsPermanent(be.Errs[1]))
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	got := map[string]bool{}
	for _, r := range cons.mustRead(t, 2) {
		got[string(r.Value)] = true
	}
	require.Equal(t, map[string]bool{"first": true, "other": true}, got)
	cons.readNothingMore(t, 300*time.Millisecond)
}

// The broker's limit is below the sink's: the partition batch is rejected
// as a whole with MESSAGE_TOO_LARGE. The sink splits it and finds the one
// message that can never be accepted; the rest keep per-key order.
func TestBrokerRejectsBatchTooLarge(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	require.NoError(t, c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "1500"}))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "small")

	var msgs []sinks.Message
	for i := range 12 {
		msgs = append(msgs, msg("small", fmt.Sprintf("k%d", i%3), int64(i), strings.Repeat("v", 300)))
	}
	// Index 4 (key k1) alone exceeds the broker's limit.
	msgs[4].Payload = bytes.Repeat([]byte("B"), 1600)
	err := s.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	want := make([]string, len(msgs))
	for i := range msgs {
		switch {
		case i == 4:
			require.True(t, sinks.IsPermanent(be.Errs[i]), "msg %d: %v", i, be.Errs[i])
			require.ErrorIs(t, be.Errs[i], kafka.MessageSizeTooLarge)
		case msgs[i].Key == "k1" && i > 4:
			require.ErrorIs(t, be.Errs[i], sinks.ErrNotAttempted, "msg %d", i)
		default:
			require.NoError(t, be.Errs[i], "msg %d", i)
			want[i] = msgs[i].ID
		}
	}
	var order []string
	for _, id := range want {
		if id != "" {
			order = append(order, id)
		}
	}
	recs := cons.mustRead(t, len(order))
	var gotOrder []string
	for _, r := range recs {
		id, _ := header(r, HeaderMessageID)
		gotOrder = append(gotOrder, id)
	}
	require.Equal(t, order, gotOrder, "one partition: offsets follow slice order")
	cons.readNothingMore(t, 300*time.Millisecond)
}

// A retriable error on one partition fails exactly that partition's
// messages, retriably; other partitions are delivered; a later Send of the
// failed messages succeeds.
func TestRetriableErrorOnOnePartition(t *testing.T) {
	t.Parallel()
	const parts = 4
	c := newCluster(t, kfake.SeedTopics(parts, "t"))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "t")

	var msgs []sinks.Message
	for i := range 40 {
		msgs = append(msgs, msg("t", fmt.Sprintf("key%d", i%10), int64(i), fmt.Sprint(i)))
	}
	bad := murmur2Partition("t", "key0", parts)
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Partitions: []int32{bad}, Err: kerr.NotLeaderForPartition})
	err := s.Send(context.Background(), msgs)
	require.Equal(t, 1, fault.Hits())
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	var retry []sinks.Message
	delivered := 0
	for i, m := range msgs {
		if murmur2Partition("t", m.Key, parts) == bad {
			require.Error(t, be.Errs[i])
			require.False(t, sinks.IsPermanent(be.Errs[i]), "NOT_LEADER is retriable: %v", be.Errs[i])
			require.ErrorIs(t, be.Errs[i], kafka.NotLeaderForPartition)
			require.ErrorIs(t, be.Errs[i], sinks.ErrUnavailable, "NOT_LEADER says the partition's broker cannot take writes")
			retry = append(retry, m)
			continue
		}
		require.NoError(t, be.Errs[i])
		delivered++
	}
	require.NotEmpty(t, retry)
	for _, r := range cons.mustRead(t, delivered) {
		require.NotEqual(t, bad, r.Partition)
	}
	require.NoError(t, s.Send(context.Background(), retry))
	cons.mustRead(t, len(retry))
}

// REQUEST_TIMED_OUT on every produce (a broker whose followers never
// catch up): the outcome is unknown, the error is retriable, and nothing
// after the batch is sent for its keys. The idempotent producer first
// resends the batch unchanged for twice metadata_ttl, and says that the
// outcome stays unknown; then it moves to a new epoch, and the relay's
// retry is accepted.
func TestTimedOutAppendIsRetriable(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		t.Run(fmt.Sprintf("idempotent=%t", idempotent), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kfake.SeedTopics(1, "t"))
			s := newSink(t, c, func(cfg *Config) {
				cfg.Idempotent = &idempotent
				cfg.MetadataTTL = 100 * time.Millisecond // the resends' window: 200ms
			})
			restore := failProduce(c, kerr.RequestTimedOut.Code)
			err := s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "a"), msg("t", "k", 2, "b")})
			restore()
			var be *sinks.BatchError
			require.ErrorAs(t, err, &be)
			for _, e := range be.Errs {
				require.ErrorIs(t, e, kafka.RequestTimedOut)
				require.ErrorIs(t, e, sinks.ErrUnavailable)
				require.False(t, sinks.IsPermanent(e))
				if idempotent {
					require.ErrorContains(t, e, "outcome unknown")
				}
			}
			require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "a")}))
		})
	}
}

// The same key on two topics is never in flight twice: a failure on the
// first topic holds back the key's later messages on the second.
func TestSameKeyAcrossTopics(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(2, "a", "b"))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "a", "b")

	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "a", Err: kerr.NotEnoughReplicas})
	msgs := []sinks.Message{
		msg("b", "k", 1, "b1"),    // wave 0: delivered
		msg("a", "k", 2, "a2"),    // wave 1: fails
		msg("b", "k", 3, "b3"),    // wave 2: held back
		msg("b", "other", 4, "o"), // wave 0: delivered
	}
	err := s.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.ErrorIs(t, be.Errs[1], kafka.NotEnoughReplicas)
	require.False(t, sinks.IsPermanent(be.Errs[1]))
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	got := map[string]bool{}
	for _, r := range cons.mustRead(t, 2) {
		got[string(r.Value)] = true
	}
	require.Equal(t, map[string]bool{"b1": true, "o": true}, got)
	cons.readNothingMore(t, 300*time.Millisecond)
}

func TestUnknownTopicIsPermanentAndNewTopicsWork(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "known"))
	s := newSink(t, c)
	// Warm the metadata cache, so "late" below is created after it.
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("known", "", 1, "x")}))

	err := s.Send(context.Background(), []sinks.Message{msg("missing", "k", 1, "x"), msg("known", "k", 2, "y"), msg("known", "j", 3, "z")})
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.True(t, sinks.IsPermanent(be.Errs[0]), "%v", be.Errs[0])
	require.ErrorIs(t, be.Errs[0], kafka.UnknownTopicOrPartition)
	require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[2])

	// Created after the cache was filled: found on a fresh lookup.
	require.NoError(t, c.CreateTopic("late", 3, nil))
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("late", "k", 1, "x")}))
	cons := newConsumer(t, c.ListenAddrs(), "late")
	cons.mustRead(t, 1)

	err = s.Send(context.Background(), []sinks.Message{msg("bad topic!", "k", 1, "x")})
	require.True(t, sinks.IsPermanent(outcome(err, 0, 1)))
	require.ErrorIs(t, outcome(err, 0, 1), kafka.InvalidTopic)
}

func TestTopicPrefixAndMap(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "env.orders", "renamed"))
	s := newSink(t, c, func(cfg *Config) {
		cfg.TopicPrefix = "env."
		cfg.TopicMap = map[string]string{"users": "renamed"}
	})
	cons := newConsumer(t, c.ListenAddrs(), "env.orders", "renamed")
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("orders", "k", 1, "o"), msg("users", "k", 2, "u")}))
	got := map[string]string{}
	for _, r := range cons.mustRead(t, 2) {
		got[r.Topic] = string(r.Value)
	}
	require.Equal(t, map[string]string{"env.orders": "o", "renamed": "u"}, got)
}

// Many partitions in one request, a batch bigger than one partition's limit
// (several waves), and concurrent Sends under -race.
func TestConcurrentSendsAndWaves(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(4, "t"))
	s := newSink(t, c, func(cfg *Config) { cfg.MaxMessageBytes = 4096 })
	cons := newConsumer(t, c.ListenAddrs(), "t")
	const senders, perSend = 4, 100
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			var msgs []sinks.Message
			for i := range perSend {
				// Keys are disjoint between senders, as the relay guarantees.
				msgs = append(msgs, msg("t", fmt.Sprintf("s%d-k%d", g, i%5), int64(i), strings.Repeat("p", 200)))
			}
			require.NoError(t, s.Send(context.Background(), msgs))
		})
	}
	wg.Wait()
	last := map[string]int64{}
	for _, r := range cons.mustRead(t, senders*perSend) {
		id, _ := header(r, HeaderMessageID)
		require.NotEmpty(t, id)
		_ = id
		k := string(r.Key)
		seq := r.Offset
		if prev, ok := last[k]; ok {
			require.Greater(t, seq, prev)
		}
		last[k] = seq
	}
}

func TestCloseAndHealthy(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s, err := New(Config{Brokers: c.ListenAddrs()}, testkit.Logger(t, slog.LevelDebug))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, s.Healthy(ctx))
	require.NoError(t, s.Send(ctx, nil))
	require.NoError(t, s.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")}))
	require.NoError(t, s.Close(ctx))
	require.NoError(t, s.Close(ctx), "Close is idempotent")
	require.ErrorIs(t, s.Send(ctx, []sinks.Message{msg("t", "k", 2, "x")}), sinks.ErrClosed)
	require.ErrorIs(t, s.Healthy(ctx), sinks.ErrClosed)

	// Nothing listens on a closed cluster's port.
	dead := newCluster(t)
	addrs := dead.ListenAddrs()
	dead.Close()
	s2 := newSink(t, c, func(cfg *Config) { cfg.Brokers = addrs; cfg.DialTimeout = time.Second })
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	require.Error(t, s2.Healthy(hctx))
	err = s2.Send(hctx, []sinks.Message{msg("t", "k", 1, "x")})
	require.Error(t, err)
	require.False(t, sinks.IsPermanent(err), "an unreachable cluster is retriable: %v", err)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")})
	require.ErrorIs(t, err, context.Canceled)

	// A broker that never answers: Send returns when ctx ends.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // swallow: no response
	})
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")})
	// ctx's deadline is also the connection's: either error may win.
	require.Error(t, outcome(err, 0, 1))
	require.False(t, sinks.IsPermanent(err))
	// ctx ends after 300ms and the broker never answers: 3s is ten times
	// that, room for -race on a loaded machine, and a Send that ignored
	// ctx would block until the test's own timeout.
	require.Less(t, time.Since(start), 3*time.Second)
}

func TestSASL(t *testing.T) {
	t.Parallel()
	for _, mech := range []struct{ kfake, ours string }{
		{"PLAIN", SASLPlain},
		{"SCRAM-SHA-256", SASLScramSHA256},
		{"SCRAM-SHA-512", SASLScramSHA512},
	} {
		t.Run(mech.ours, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kfake.EnableSASL(), kfake.Superuser(mech.kfake, "relay", "s3cret"), kfake.SeedTopics(1, "t"))
			s := newSink(t, c, func(cfg *Config) {
				cfg.SASL = SASLConfig{Mechanism: mech.ours, Username: "relay", Password: "s3cret"}
			})
			require.NoError(t, s.Healthy(context.Background()))
			require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "x")}))

			wrong := newSink(t, c, func(cfg *Config) {
				cfg.SASL = SASLConfig{Mechanism: mech.ours, Username: "relay", Password: "nope"}
				cfg.DialTimeout = 2 * time.Second
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := wrong.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")})
			require.Error(t, err)
			require.False(t, sinks.IsPermanent(err), "bad credentials are not the message's fault")
			// kfake refuses credentials by closing the connection, as a
			// broker answering SaslAuthenticate v0 does: nothing was
			// produced, so no attempt is spent, and the error says where
			// to look. (TestSASLRefusedWithCode covers the answer of a
			// current broker.)
			require.ErrorIs(t, outcome(err, 0, 1), sinks.ErrNotAttempted)
			require.ErrorContains(t, err, `check sasl.mechanism `+mech.ours+`, user "relay"`)
			require.NotContains(t, err.Error(), "nope")
			herr := wrong.Healthy(ctx)
			require.ErrorContains(t, herr, "check sasl.mechanism")
			require.NotContains(t, herr.Error(), "nope")
		})
	}
}

func TestPermanentCodesAreNotTemporary(t *testing.T) {
	t.Parallel()
	for code := range permanentCodes {
		require.False(t, code.Temporary(), "%v", code)
	}
	require.True(t, isPermanentCode(fmt.Errorf("x: %w", kafka.MessageSizeTooLarge)))
	require.False(t, isPermanentCode(kafka.TopicAuthorizationFailed))
	require.False(t, isPermanentCode(errors.New("io")))
}

// murmur2 of kafka-go and of kgo/Java agree on many keys, not only on the
// ones the delivery test happens to use.
func TestMurmur2MatchesJavaPartitioner(t *testing.T) {
	t.Parallel()
	b := Config{}.withDefaults().balancer()
	parts := make([]int, 12)
	for i := range parts {
		parts[i] = i
	}
	for i := range 2000 {
		key := fmt.Sprintf("aggregate-%d", i*7919)
		require.Equal(t, murmur2Partition("t", key, len(parts)), int32(b.Balance(kafka.Message{Key: []byte(key)}, parts...)), key)
	}
}

// The broker answers that say the partition's broker cannot take writes
// wrap sinks.ErrUnavailable (evidence of an outage when they span keys);
// answers about the record, the topic or the client's rights do not.
func TestUnavailableCodes(t *testing.T) {
	t.Parallel()
	for _, ke := range []kafka.Error{kafka.LeaderNotAvailable, kafka.NotLeaderForPartition, kafka.RequestTimedOut,
		kafka.BrokerNotAvailable, kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend, kafka.KafkaStorageError} {
		err := produceError("t", 0, int16(ke), "")
		require.ErrorIs(t, err, sinks.ErrUnavailable, "%s", ke.Title())
		require.ErrorIs(t, err, ke)
		require.False(t, sinks.IsPermanent(classify(err)), "%s", ke.Title())
	}
	for _, ke := range []kafka.Error{kafka.UnknownTopicOrPartition, kafka.TopicAuthorizationFailed,
		kafka.InvalidTimestamp, kafka.MessageSizeTooLarge, kafka.Unknown} {
		require.NotErrorIs(t, produceError("t", 0, int16(ke), ""), sinks.ErrUnavailable, "%s", ke.Title())
	}
}
