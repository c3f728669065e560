package kafkasink

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outbox-relay/outbox-relay/internal/testkit/kafkatest"
	"github.com/outbox-relay/outbox-relay/sinks"
)

func ptr[T any](v T) *T { return &v }

// deliver sends msgs as the relay does: the messages that fail (any
// error, not attempted included) are sent again, in order, in a later
// Send, until every one is delivered. It returns the number of Sends.
func deliver(t *testing.T, s *Sink, msgs []sinks.Message) int {
	t.Helper()
	pending := msgs
	for sends := 1; sends <= 5; sends++ {
		err := s.Send(context.Background(), pending)
		var next []sinks.Message
		for i, m := range pending {
			if e := outcome(err, i, len(pending)); e != nil {
				require.False(t, sinks.IsPermanent(e), "message %d: %v", i, e)
				next = append(next, m)
			}
		}
		if pending = next; len(pending) == 0 {
			return sends
		}
	}
	t.Fatalf("%d messages still not delivered after 5 sends", len(pending))
	return 0
}

// keyedBatch is n messages over keys keys, positions from first on.
func keyedBatch(topic string, n, keys int, first int64) []sinks.Message {
	msgs := make([]sinks.Message, n)
	for i := range msgs {
		msgs[i] = msg(topic, fmt.Sprintf("key-%d", i%keys), first+int64(i), fmt.Sprintf("payload-%d", i))
	}
	return msgs
}

// requireOnceInKeyOrder checks that recs are msgs, each exactly once, and
// that each key's records follow its messages' order.
func requireOnceInKeyOrder(t *testing.T, recs []*kgo.Record, msgs []sinks.Message) {
	t.Helper()
	seqOf := map[string]int64{}
	for _, m := range msgs {
		seqOf[m.ID] = m.Seq
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, r := range recs {
		id, _ := header(r, HeaderMessageID)
		require.False(t, seen[id], "message %s appended twice", id)
		seen[id] = true
		seq, ok := seqOf[id]
		require.True(t, ok, "unexpected record %s", id)
		if prev, ok := last[string(r.Key)]; ok {
			require.Greater(t, seq, prev, "key %s out of order", r.Key)
		}
		last[string(r.Key)] = seq
	}
	require.Len(t, seen, len(msgs), "every message delivered")
}

// The broker appends a produce request, and its answer never reaches the
// sink (the connection breaks after the append, or the broker answers
// REQUEST_TIMED_OUT after appending). With the idempotent producer the
// sink sends the same record batches again, with the same producer
// sequence, and the broker drops them: every message is in the topic
// once, each key in order. Without it, the same fault makes the relay's
// retry append the messages a second time: the injection does create
// duplicates, so the first case can fail.
func TestLostAnswerIsNotDuplicated(t *testing.T) {
	t.Parallel()
	faults := []struct {
		name string
		// inject arms the fault; hits then says how often it fired.
		inject func(*kfake.Cluster, *kafkatest.AnswerLoss) (hits func() int)
		lost   int // how many times the broker appends the batch without a usable answer
	}{
		{"answer lost after the append", func(_ *kfake.Cluster, a *kafkatest.AnswerLoss) func() int { a.Lose(1); return a.Lost }, 1},
		{"answer lost twice", func(_ *kfake.Cluster, a *kafkatest.AnswerLoss) func() int { a.Lose(2); return a.Lost }, 2},
		{"REQUEST_TIMED_OUT after the append", func(c *kfake.Cluster, _ *kafkatest.AnswerLoss) func() int {
			return c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut}).Hits
		}, 1},
	}
	for _, f := range faults {
		for _, idempotent := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/idempotent=%t", f.name, idempotent), func(t *testing.T) {
				t.Parallel()
				loss := &kafkatest.AnswerLoss{}
				c := newCluster(t, kfake.SeedTopics(4, "t"), kfake.ListenFn(loss.Listen))
				s := newSink(t, c, func(cfg *Config) { cfg.Idempotent = ptr(idempotent) })
				cons := newConsumer(t, c.ListenAddrs(), "t")
				warm := msg("t", "warm", 0, "warm") // metadata, connections, producer id
				require.NoError(t, s.Send(context.Background(), []sinks.Message{warm}))
				cons.mustRead(t, 1)

				msgs := keyedBatch("t", 60, 6, 1) // one request: every partition has one leader
				hits := f.inject(c, loss)
				sends := deliver(t, s, msgs)
				require.Equal(t, f.lost, hits(), "the fault fired")
				if !idempotent {
					require.Equal(t, 1+f.lost, sends, "every lost answer costs the relay a retry")
					recs := cons.mustRead(t, (1+f.lost)*len(msgs))
					cons.readNothingMore(t, 300*time.Millisecond)
					require.Len(t, recs, (1+f.lost)*len(msgs), "each attempt appended every message: duplicates")
					return
				}
				require.Equal(t, 1, sends, "the sink resent the batch itself; the Send succeeded")
				recs := cons.mustRead(t, len(msgs))
				cons.readNothingMore(t, 300*time.Millisecond)
				requireOnceInKeyOrder(t, recs, msgs)
				for _, r := range recs {
					require.GreaterOrEqual(t, r.ProducerID, int64(0), "written by the idempotent producer")
				}
			})
		}
	}
}

// A batch whose answers stay lost is resent for twice metadata_ttl, then
// the Send gives up: its messages fail as unavailable (the records may be
// in the topic), and the producer moves to a new epoch, so the relay's
// retry is accepted (not refused as out of sequence) and appends them a
// second time: the duplicate the guarantee allows for.
func TestLostAnswersGiveUpAndMoveOn(t *testing.T) {
	t.Parallel()
	loss := &kafkatest.AnswerLoss{}
	c := newCluster(t, kfake.SeedTopics(2, "t"), kfake.ListenFn(loss.Listen))
	s := newSink(t, c, func(cfg *Config) { cfg.MetadataTTL = 250 * time.Millisecond })
	cons := newConsumer(t, c.ListenAddrs(), "t")
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "warm", 0, "warm")}))
	cons.mustRead(t, 1)

	msgs := keyedBatch("t", 10, 3, 1)
	loss.Lose(-1)
	start := time.Now()
	err := s.Send(context.Background(), msgs)
	loss.Lose(0)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "resent for twice metadata_ttl")
	require.Greater(t, loss.Lost(), 2, "the batch was resent")
	for i := range msgs {
		e := outcome(err, i, len(msgs))
		require.ErrorIs(t, e, sinks.ErrUnavailable)
		require.ErrorContains(t, e, "outcome unknown")
		require.False(t, sinks.IsPermanent(e))
	}

	require.NoError(t, s.Send(context.Background(), msgs), "the relay's retry, under a new epoch")
	recs := cons.mustRead(t, 2*len(msgs))
	cons.readNothingMore(t, 300*time.Millisecond)
	epochs := map[int16]int{}
	for _, r := range recs {
		epochs[r.ProducerEpoch]++
	}
	require.Equal(t, map[int16]int{0: len(msgs), 1: len(msgs)}, epochs,
		"appended once by the first attempt (its resends were dropped), once by the retry under the bumped epoch")
}

// The broker refuses a batch for the producer's state: nothing was
// appended, the producer moves on (a new epoch, or a new id for a fenced
// epoch) and the sink sends the batch again in the same Send.
func TestProducerStateErrorsMoveOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err     *kerr.Error
		newID   bool
		maxVers *kversion.Versions // the brokers' versions; nil is the newest
	}{
		{err: kerr.OutOfOrderSequenceNumber},
		{err: kerr.UnknownProducerID},
		{err: kerr.InvalidProducerEpoch, newID: true},
		{err: kerr.ProducerFenced, newID: true},
		// Brokers before 2.5 (InitProducerId v2) do not take a bumped
		// epoch: a new id instead.
		{err: kerr.OutOfOrderSequenceNumber, newID: true, maxVers: initProducerIDUpTo(2)},
	} {
		t.Run(fmt.Sprintf("%s/newID=%t", tc.err.Message, tc.newID), func(t *testing.T) {
			t.Parallel()
			opts := []kfake.Opt{kfake.SeedTopics(3, "t")}
			if tc.maxVers != nil {
				opts = append(opts, kfake.MaxVersions(tc.maxVers))
			}
			c := newCluster(t, opts...)
			s := newSink(t, c)
			cons := newConsumer(t, c.ListenAddrs(), "t")
			first := keyedBatch("t", 9, 3, 1)
			require.NoError(t, s.Send(context.Background(), first))

			fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: tc.err})
			second := keyedBatch("t", 9, 3, 10)
			require.NoError(t, s.Send(context.Background(), second))
			require.Equal(t, 1, fault.Hits())

			recs := cons.mustRead(t, 18)
			cons.readNothingMore(t, 300*time.Millisecond)
			requireOnceInKeyOrder(t, recs, append(first, second...))
			pids := map[int64]bool{}
			epochs := map[int16]bool{}
			for _, r := range recs {
				pids[r.ProducerID] = true
				epochs[r.ProducerEpoch] = true
			}
			if tc.newID {
				require.Len(t, pids, 2, "a new producer id")
				require.Equal(t, map[int16]bool{0: true}, epochs)
			} else {
				require.Len(t, pids, 1, "the same producer id")
				require.Equal(t, map[int16]bool{0: true, 1: true}, epochs, "the epoch bumped")
			}
		})
	}
}

// initProducerIDUpTo is the newest Kafka with InitProducerId capped at v
// (v < 0: without InitProducerId, as before Kafka 0.11).
func initProducerIDUpTo(v int16) *kversion.Versions {
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.InitProducerID), v)
	return vs
}

// A batch that the broker keeps refusing for the producer's state fails
// after the one resend, and the key gate holds: the key's later message
// on another topic is not attempted, other keys are delivered.
func TestProducerStateErrorKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(2, "a", "b"))
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "a", "b")
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "a", Err: kerr.OutOfOrderSequenceNumber, Count: -1})
	msgs := []sinks.Message{
		msg("b", "k", 1, "b1"),    // wave 0: delivered
		msg("a", "k", 2, "a2"),    // wave 1: refused twice
		msg("b", "k", 3, "b3"),    // wave 2: held back
		msg("b", "other", 4, "o"), // wave 0: delivered
	}
	err := s.Send(context.Background(), msgs)
	fault.Remove()
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.ErrorIs(t, be.Errs[1], kafka.OutOfOrderSequenceNumber)
	require.False(t, sinks.IsPermanent(be.Errs[1]))
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	require.Equal(t, 2, fault.Hits(), "the batch, then once more under a new epoch")
	got := map[string]bool{}
	for _, r := range cons.mustRead(t, 2) {
		got[string(r.Value)] = true
	}
	require.Equal(t, map[string]bool{"b1": true, "o": true}, got)
	cons.readNothingMore(t, 300*time.Millisecond)

	require.NoError(t, s.Send(context.Background(), msgs[1:3]), "the relay's retry, in order")
	var order []string
	for _, r := range cons.mustRead(t, 2) {
		order = append(order, string(r.Value))
	}
	require.ElementsMatch(t, []string{"a2", "b3"}, order)
}

// Brokers that refuse the idempotent producer: with idempotent unset the
// sink produces without it; with idempotent=true its Sends fail, not
// attempted, naming the option, until the brokers accept.
func TestIdempotenceRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opts   []kfake.Opt
		fault  *kerr.Error // InitProducerId's answer
		reason string
	}{
		{name: "CLUSTER_AUTHORIZATION_FAILED", fault: kerr.ClusterAuthorizationFailed, reason: "Cluster Authorization Failed"},
		{name: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", fault: kerr.TransactionalIDAuthorizationFailed, reason: "Transactional ID Authorization Failed"},
		{name: "UNSUPPORTED_VERSION", fault: kerr.UnsupportedVersion, reason: "Unsupported Version"},
		{name: "no InitProducerId", opts: []kfake.Opt{kfake.MaxVersions(initProducerIDUpTo(-1))}, reason: "Kafka before 0.11"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, append([]kfake.Opt{kfake.SeedTopics(1, "t")}, tc.opts...)...)
			var fault *kfake.FaultHandle
			if tc.fault != nil {
				fault = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: tc.fault, Count: -1})
			}
			cons := newConsumer(t, c.ListenAddrs(), "t")

			auto := newSink(t, c)
			require.NoError(t, auto.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "auto")}))
			r := cons.mustRead(t, 1)[0]
			require.Equal(t, int64(-1), r.ProducerID, "produced without the idempotent producer")

			required := newSink(t, c, func(cfg *Config) { cfg.Idempotent = ptr(true) })
			err := required.Send(context.Background(), []sinks.Message{msg("t", "k", 2, "required")})
			e := outcome(err, 0, 1)
			require.ErrorIs(t, e, ErrIdempotenceRefused)
			require.ErrorIs(t, e, sinks.ErrNotAttempted, "nothing was produced: no attempt spent")
			require.False(t, sinks.IsPermanent(e))
			require.ErrorContains(t, e, "idempotent=false")
			require.ErrorContains(t, e, tc.reason)
			cons.readNothingMore(t, 300*time.Millisecond)
			if fault == nil {
				return
			}
			fault.Remove()
			require.NoError(t, required.Send(context.Background(), []sinks.Message{msg("t", "k", 2, "required")}),
				"accepted once the brokers allow it, without a restart")
			require.GreaterOrEqual(t, cons.mustRead(t, 1)[0].ProducerID, int64(0))
		})
	}
}

// Concurrent Sends share partitions: the producer keeps one request per
// partition on the wire, so the broker never sees a sequence out of
// order, and every message is appended once.
func TestIdempotentConcurrentSendsSharePartitions(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(3, "t"))
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
	s := newSink(t, c)
	cons := newConsumer(t, c.ListenAddrs(), "t")
	const senders, sends = 6, 10
	errs := make(chan error, senders*sends)
	done := make(chan struct{})
	var all []sinks.Message
	batches := make([][][]sinks.Message, senders)
	for g := range senders {
		for b := range sends {
			batch := keyedBatch("t", 12, 3, int64(g*1000+b*12))
			for i := range batch {
				batch[i].Key = fmt.Sprintf("s%d-%s", g, batch[i].Key) // the relay never sends one key from two workers at once
			}
			batches[g] = append(batches[g], batch)
			all = append(all, batch...)
		}
	}
	for g := range senders {
		go func() {
			defer func() { done <- struct{}{} }()
			for _, batch := range batches[g] {
				errs <- s.Send(context.Background(), batch)
			}
		}()
	}
	for range senders {
		<-done
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	requireOnceInKeyOrder(t, cons.mustRead(t, len(all)), all)
	cons.readNothingMore(t, 300*time.Millisecond)
	require.GreaterOrEqual(t, fault.Hits(), senders*sends, "one request per Send at least")
}

// Sequence numbers wrap to 0 after math.MaxInt32, as the brokers count.
func TestNextSeqWraps(t *testing.T) {
	t.Parallel()
	require.Equal(t, int32(15), nextSeq(5, 10))
	require.Equal(t, int32(math.MaxInt32), nextSeq(math.MaxInt32-1, 1))
	require.Equal(t, int32(0), nextSeq(math.MaxInt32, 1))
	require.Equal(t, int32(1), nextSeq(math.MaxInt32-1, 3))
}

// While a batch is resent after an unknown outcome, its partition takes
// no other batch: another Send for it does not wait (the resends take
// seconds) and is not sent, so the relay backs off as from a broker it
// cannot reach. It could not go under this epoch anyway: it would take
// the doubtful batch's sequence number, and if the broker had appended
// that batch, it would take this one, of the same size, for a duplicate
// and drop it. Once the first Send gives up, the relay's retry goes under
// a new epoch: both batches are in the topic.
func TestGivenUpSequenceIsNotReused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c, func(cfg *Config) { cfg.MetadataTTL = time.Second }) // resends for 2s
	cons := newConsumer(t, c.ListenAddrs(), "t")
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "warm", 0, "warm")}))
	cons.mustRead(t, 1)

	first, second := keyedBatch("t", 5, 1, 1), keyedBatch("t", 5, 1, 6)
	for i := range first {
		first[i].Key, first[i].Payload = "a", []byte("first")
		second[i].Key, second[i].Payload = "b", []byte("second")
	}
	// Every attempt of the first batch is appended (once) and answered
	// REQUEST_TIMED_OUT: its outcome stays unknown until the Send gives up.
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1,
		When: func(r kmsg.Request) bool {
			for _, t := range r.(*kmsg.ProduceRequest).Topics {
				for _, p := range t.Partitions {
					if bytes.Contains(p.Records, []byte("first")) {
						return true
					}
				}
			}
			return false
		}})
	firstErr := make(chan error, 1)
	go func() { firstErr <- s.Send(context.Background(), first) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, fault.Wait(ctx, 1))
	err := s.Send(context.Background(), second)
	for i := range second {
		e := outcome(err, i, len(second))
		require.ErrorIs(t, e, sinks.ErrNotAttempted, "not sent while the partition is in doubt")
		require.ErrorContains(t, e, "busy")
	}
	err = <-firstErr
	require.ErrorContains(t, outcome(err, 0, len(first)), "outcome unknown")
	fault.Remove()
	require.NoError(t, s.Send(context.Background(), second), "the relay's retry, under a new epoch")

	recs := cons.mustRead(t, 10)
	cons.readNothingMore(t, 300*time.Millisecond)
	got := map[string]int{}
	for _, r := range recs {
		got[string(r.Value)]++
	}
	require.Equal(t, map[string]int{"first": 5, "second": 5}, got)
}

// The producer id comes from InitProducerId sent to any broker, as an
// idempotent producer asks for it: no FindCoordinator for a transactional
// id first (kafka-go's own request type is routed that way, and on Kafka
// the lookup creates the __transaction_state topic).
func TestProducerIDWithoutCoordinatorLookup(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	var lookups, inits atomic.Int32
	c.ControlKey(int16(kmsg.FindCoordinator), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	s := newSink(t, c, func(cfg *Config) { cfg.Idempotent = ptr(true) })
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "k", 0, "v")}))
	require.Equal(t, int32(1), inits.Load(), "one InitProducerId")
	require.Zero(t, lookups.Load(), "no FindCoordinator before it")
}
