package kafkainbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/kafkainbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
)

const topic = "transfers"

type env struct {
	cluster *kfake.Cluster
	sink    *kafkasink.Sink
	pool    *pgxpool.Pool
	schema  string
	in      *inbox.Inbox
	hooks   *counting
}

func setup(t testing.TB, partitions int32) *env {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		testkit.Unavailable(t, "service", "kfake cluster cannot start on loopback: %v", err)
	}
	t.Cleanup(c.Close)
	s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), WriteTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	pool, schema := inboxtest.Schema(t)
	h := &counting{}
	in, err := inbox.New(inbox.Config{Schema: schema, Hooks: h})
	require.NoError(t, err)
	return &env{cluster: c, sink: s, pool: pool, schema: schema, in: in, hooks: h}
}

// send publishes msgs through the relay's own Kafka sink, so the test
// reads what the relay puts on the wire.
func (e *env) send(t testing.TB, msgs ...sinks.Message) {
	t.Helper()
	require.NoError(t, e.sink.Send(t.Context(), msgs))
}

func (e *env) reader(t testing.TB, group string) *kafka.Reader {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: e.cluster.ListenAddrs(), GroupID: group, Topic: topic,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 50 * time.Millisecond, StartOffset: kafka.FirstOffset,
		HeartbeatInterval: 200 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 2 * time.Second,
		JoinGroupBackoff: 100 * time.Millisecond,
	})
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func (e *env) consumer(r kafkainbox.Reader, batch int) *kafkainbox.Consumer {
	return &kafkainbox.Consumer{Reader: r, Inbox: e.in, DB: e.pool, MaxBatch: batch,
		Handle: func(ctx context.Context, tx pgx.Tx, r kafka.Message) error {
			m, err := kafkainbox.Message(r)
			if err != nil {
				return err
			}
			return inboxtest.EffectPayload(ctx, tx, e.schema, m, string(r.Value))
		}}
}

// transfers returns n messages over keys, positions growing in write
// order like outbox ids.
func transfers(n, keys int) []sinks.Message {
	out := make([]sinks.Message, n)
	for i := range out {
		out[i] = sinks.Message{ID: uuid.NewString(), Seq: int64(100 + i), Topic: topic, Key: fmt.Sprintf("acct-%d", i%keys),
			Payload: fmt.Appendf(nil, "t%d", i), CreatedAt: time.Now(), Attempt: 1}
	}
	return out
}

func TestMessageFromRecord(t *testing.T) {
	t.Parallel()
	id := uuid.NewString()
	m, err := kafkainbox.Message(kafka.Message{Key: []byte("k"), Headers: []kafka.Header{{Key: "outbox-message-id", Value: []byte(id)}, {Key: "outbox-seq", Value: []byte("42")}}})
	require.NoError(t, err)
	require.Equal(t, inbox.Message{ID: id, Key: "k", Seq: 42}, m)
	m, err = kafkainbox.Message(kafka.Message{Key: []byte("k"), Headers: []kafka.Header{{Key: "outbox-message-id", Value: []byte(id)}, {Key: "outbox-producer", Value: []byte("orders/outbox")}}})
	require.NoError(t, err)
	require.Equal(t, inbox.Message{ID: id, Key: "k", Producer: "orders/outbox"}, m)
	_, err = kafkainbox.Message(kafka.Message{})
	require.ErrorIs(t, err, kafkainbox.ErrNoID)
	_, err = kafkainbox.Message(kafka.Message{Headers: []kafka.Header{{Key: "outbox-message-id", Value: []byte(id)}, {Key: "outbox-seq", Value: []byte("x")}}})
	require.ErrorContains(t, err, "outbox-seq")
}

// A consumer killed after its transaction committed but before its offset
// commit processes nothing twice: the next consumer of the group gets the
// records again and the inbox skips them. Relay redeliveries (the same
// messages published again after later ones of their keys) are skipped
// too.
func TestKilledBeforeOffsetCommitProcessesNothingTwice(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	msgs := transfers(40, 4)
	e.send(t, msgs[:30]...)
	e.send(t, msgs[5:10]...) // a relay redelivery after later messages
	e.send(t, msgs[30:]...)

	// The first consumer dies at its third offset commit: that batch's
	// transaction has committed, its offsets are not.
	r1 := e.reader(t, "g")
	kill := &killAt{Reader: r1, at: 3}
	err := e.consumer(kill, 4).Run(t.Context())
	require.ErrorIs(t, err, errKilled)
	require.NoError(t, r1.Close())
	applied := len(inboxtest.Effects(t, e.pool, e.schema))
	require.Greater(t, applied, 8, "the killed consumer's last batch committed")

	// Its successor in the group starts at the last committed offset.
	r2 := e.reader(t, "g")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.consumer(r2, 4).Run(ctx) }()
	testkit.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := len(inboxtest.Effects(t, e.pool, e.schema))
		return n == len(msgs) && e.hooks.dups.Load() >= 5+4, fmt.Sprintf("%d of %d applied, %d duplicates", n, len(msgs), e.hooks.dups.Load())
	})
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	checkOnceInOrder(t, inboxtest.Effects(t, e.pool, e.schema), msgs)
	t.Logf("duplicates absorbed: %d (5 relay redeliveries, the rest the killed batch)", e.hooks.dups.Load())
}

// Two consumers of one group over three partitions, the second joining
// while the first is in the middle of its records (a rebalance), apply
// each message once and each key in order. A consumer whose offset commit
// fails in the rebalance starts again with a new reader, as a service
// would; what it had committed to the database comes again and is skipped.
func TestRebalanceAppliesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	msgs := transfers(300, 12)
	e.send(t, msgs...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var applied [2]atomic.Int64
	secondStarted := make(chan struct{})
	var wg sync.WaitGroup
	start := func(n int) {
		wg.Go(func() {
			for ctx.Err() == nil {
				c := e.consumer(e.reader(t, "g"), 8)
				handle := c.Handle
				c.Handle = func(ctx context.Context, tx pgx.Tx, r kafka.Message) error {
					// The first consumer waits, in the middle of its
					// records, for the second to join and take some (a
					// second that started was not yet in the group: the
					// first took all 300 in 0.3 s once); after 15 s it
					// goes on, and the test says the second took none.
					if n == 0 && applied[0].Load() == 30 {
						select {
						case <-secondStarted:
						case <-ctx.Done():
							return ctx.Err()
						}
						joined, stop := context.WithTimeout(ctx, 15*time.Second)
						testkit.Poll(joined, 5*time.Millisecond, func() bool { return applied[1].Load() > 0 })
						stop()
					}
					applied[n].Add(1)
					return handle(ctx, tx, r)
				}
				if err := c.Run(ctx); err != nil && ctx.Err() == nil {
					t.Logf("consumer %d starts again after: %v", n, err)
				}
			}
		})
	}
	start(0)
	testkit.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		return applied[0].Load() >= 30, "waiting for the first consumer"
	})
	start(1)
	close(secondStarted)
	testkit.Eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := len(inboxtest.Effects(t, e.pool, e.schema))
		return n == len(msgs), fmt.Sprintf("%d of %d applied", n, len(msgs))
	})
	cancel()
	wg.Wait()
	checkOnceInOrder(t, inboxtest.Effects(t, e.pool, e.schema), msgs)
	require.Positive(t, applied[1].Load(), "the second consumer took part")
	t.Logf("handled by the first consumer %d, by the second %d; %d duplicates skipped", applied[0].Load(), applied[1].Load(), e.hooks.dups.Load())
}

func checkOnceInOrder(t *testing.T, got []inboxtest.Applied, msgs []sinks.Message) {
	t.Helper()
	require.Len(t, got, len(msgs))
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, a := range got {
		require.False(t, seen[a.ID], "message %s applied twice", a.ID)
		seen[a.ID] = true
		require.Greater(t, a.Seq, last[a.Key], "key %s applied out of order", a.Key)
		last[a.Key] = a.Seq
	}
}

var errKilled = errors.New("killed before the offset commit")

// killAt fails the at-th offset commit, as a consumer killed between its
// database commit and its offset commit would never make it.
type killAt struct {
	*kafka.Reader
	at, n int
}

func (k *killAt) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	if k.n++; k.n == k.at {
		return errKilled
	}
	return k.Reader.CommitMessages(ctx, msgs...)
}

type counting struct{ dups, ooo atomic.Int64 }

func (c *counting) Duplicate(inbox.Message)         { c.dups.Add(1) }
func (c *counting) OutOfOrder(inbox.Message, int64) { c.ooo.Add(1) }
func (c *counting) Gap(inbox.Message, int64)        {}

// An out-of-order record stops the consumer with an *inbox.OutOfOrderError
// and its offset uncommitted: the next consumer of the group gets it
// again, and it is still reported, never applied and never skipped.
func TestOutOfOrderStopsWithOffsetUncommitted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	msgs := transfers(3, 1)
	msgs[2].Seq = msgs[0].Seq // below the mark the second one sets
	e.send(t, msgs...)
	for range 2 {
		r := e.reader(t, "g")
		err := e.consumer(r, 1).Run(t.Context())
		var ooo *inbox.OutOfOrderError
		require.ErrorAs(t, err, &ooo)
		require.Equal(t, msgs[2].ID, ooo.ID)
		require.Equal(t, msgs[1].Seq, ooo.Mark)
		require.NoError(t, r.Close())
	}
	require.Len(t, inboxtest.Effects(t, e.pool, e.schema), 2)
}
