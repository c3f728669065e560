package redisinbox_test

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
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/redisinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/redissink"
)

// Entries written by the relay's Redis sink, some twice (a relay
// redelivery after later entries of their keys); a consumer that commits
// an entry and dies before its XACK; a second consumer claims the pending
// entry and handles the rest as one batch (HandleBatch): every message
// applied once, each key in order.
func TestKilledBeforeXAck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	opts, err := redis.ParseURL(testkit.RedisURL())
	require.NoError(t, err)
	opts.DisableIdentity = true
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		testkit.Unavailable(t, "service", "Redis not reachable at TEST_REDIS_URL (%s): %v", testkit.RedisURL(), err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	stream := "inboxtest:" + hex.EncodeToString(b[:])
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err())

	sink, err := redissink.New(redissink.Config{URL: testkit.RedisURL()}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close(context.Background()) })
	var msgs []sinks.Message
	for i := range 20 {
		msgs = append(msgs, sinks.Message{ID: uuid.NewString(), Seq: int64(70 + i), Topic: stream, Key: fmt.Sprintf("acct-%d", i%3),
			Payload: []byte("x"), CreatedAt: time.Now(), Attempt: 1, Headers: map[string]string{sinks.HeaderProducer: "orders/outbox"}})
	}
	require.NoError(t, sink.Send(ctx, msgs[:12]))
	require.NoError(t, sink.Send(ctx, msgs[1:4]))
	require.NoError(t, sink.Send(ctx, msgs[12:]))

	pool, schema := inboxtest.Schema(t)
	var dups atomic.Int64
	in, err := inbox.New(inbox.Config{Schema: schema, Hooks: hooks{&dups}})
	require.NoError(t, err)
	apply := func(ctx context.Context, tx pgx.Tx, x redis.XMessage) error {
		m, err := redisinbox.Message(x)
		if err != nil {
			return err
		}
		if m.Producer != "orders/outbox" {
			return fmt.Errorf("producer %q: the relay's outbox-producer header was not read", m.Producer)
		}
		return inboxtest.Effect(ctx, tx, schema, m)
	}
	g := redisinbox.Group{Client: rdb, Stream: stream, Group: "g"}

	// Consumer c1 reads 8 entries, handles 7, commits the 8th and dies.
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{stream, ">"}, Count: 8}).Result()
	require.NoError(t, err)
	xs := res[0].Messages
	for _, x := range xs[:7] {
		_, err := redisinbox.Handle(ctx, in, pool, g, x, apply)
		require.NoError(t, err)
	}
	m, err := redisinbox.Message(xs[7])
	require.NoError(t, err)
	_, err = in.Run(ctx, pool, m, func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, xs[7]) })
	require.NoError(t, err)

	// Consumer c2 claims what c1 left pending, then reads on.
	claimed, _, err := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: stream, Group: "g", Consumer: "c2", Start: "0", MinIdle: 0}).Result()
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	for _, x := range claimed {
		o, err := redisinbox.Handle(ctx, in, pool, g, x, apply)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, o)
	}
	// The rest as one batch: one transaction, one XACK.
	res, err = rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c2", Streams: []string{stream, ">"}, Count: 100}).Result()
	require.NoError(t, err)
	require.NoError(t, redisinbox.HandleBatch(ctx, in, pool, g, res[0].Messages, apply))
	pending, err := rdb.XPending(ctx, stream, "g").Result()
	require.NoError(t, err)
	require.Zero(t, pending.Count, "every entry acked")
	got := inboxtest.Effects(t, pool, schema)
	require.Len(t, got, len(msgs))
	for i, a := range got {
		require.Equal(t, msgs[i].ID, a.ID, "applied once, in order")
	}
	require.EqualValues(t, 1+3, dups.Load())
}

type hooks struct{ dups *atomic.Int64 }

func (h hooks) Duplicate(inbox.Message)         { h.dups.Add(1) }
func (h hooks) OutOfOrder(inbox.Message, int64) {}
func (h hooks) Gap(inbox.Message, int64)        {}
