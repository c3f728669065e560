package natsinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/natsinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/natssink"
)

// Messages published by the relay's NATS sink; a consumer that commits a
// message and dies before its ack; the redelivery after the ack wait is
// skipped, every message is applied once, each key in order.
func TestKilledBeforeAck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, err := nats.Connect(testkit.NATSURL(), nats.Timeout(2*time.Second))
	if err != nil {
		testkit.Unavailable(t, "service", "NATS not reachable at TEST_NATS_URL (%s): %v", testkit.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "INBOXTEST_" + hex.EncodeToString(b[:])
	prefix := "inboxtest" + hex.EncodeToString(b[:])
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		testkit.Unavailable(t, "service", "JetStream not enabled at TEST_NATS_URL (%s): %v", testkit.NATSURL(), err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

	sink, err := natssink.New(natssink.Config{URL: testkit.NATSURL()}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close(context.Background()) })
	var msgs []sinks.Message
	for i := range 20 {
		msgs = append(msgs, sinks.Message{ID: uuid.NewString(), Seq: int64(50 + i), Topic: prefix + ".transfers", Key: fmt.Sprintf("acct-%d", i%3),
			Payload: []byte("x"), CreatedAt: time.Now(), Attempt: 1, Headers: map[string]string{sinks.HeaderProducer: "orders/outbox"}})
	}
	require.NoError(t, sink.Send(ctx, msgs))

	pool, schema := inboxtest.Schema(t)
	var dups atomic.Int64
	in, err := inbox.New(inbox.Config{Schema: schema, Hooks: hooks{&dups}})
	require.NoError(t, err)
	apply := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		m, err := natsinbox.Message(msg)
		if err != nil {
			return err
		}
		if m.Producer != "orders/outbox" {
			return fmt.Errorf("producer %q: the relay's outbox-producer header was not read", m.Producer)
		}
		return inboxtest.Effect(ctx, tx, schema, m)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 300 * time.Millisecond, MaxAckPending: 1})
	require.NoError(t, err)

	handled := 0
	killed := false
	testkit.Eventually(t, 30*time.Second, time.Millisecond, func() (bool, string) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		require.NoError(t, err)
		for msg := range batch.Messages() {
			if handled == 7 && !killed {
				// Committed, never acked: this consumer dies here.
				killed = true
				m, err := natsinbox.Message(msg)
				require.NoError(t, err)
				_, err = in.Run(ctx, pool, m, func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, msg) })
				require.NoError(t, err)
				continue
			}
			_, err := natsinbox.Handle(ctx, in, pool, msg, apply)
			require.NoError(t, err)
			handled++
		}
		n := len(inboxtest.Effects(t, pool, schema))
		return n == len(msgs) && dups.Load() == 1, fmt.Sprintf("%d of %d applied, %d duplicates", n, len(msgs), dups.Load())
	})
	got := inboxtest.Effects(t, pool, schema)
	require.Len(t, got, len(msgs))
	for i, a := range got {
		require.Equal(t, msgs[i].ID, a.ID, "applied once, in order")
		require.Equal(t, msgs[i].Seq, a.Seq)
	}
}

type hooks struct{ dups *atomic.Int64 }

func (h hooks) Duplicate(inbox.Message)         { h.dups.Add(1) }
func (h hooks) OutOfOrder(inbox.Message, int64) {}
func (h hooks) Gap(inbox.Message, int64)        {}
