package cli_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// TestRunNATSEndToEnd relays through the real command line into a
// JetStream stream of the shared server: every committed message once, in
// order per key, headers as NATS headers, Nats-Msg-Id = message id; a
// message whose subject no stream covers is dead-lettered with "no stream"
// while the other keys flow.
func TestRunNATSEndToEnd(t *testing.T) {
	pool, schema, w := e2e(t)
	nc, err := nats.Connect(testkit.NATSURL(), nats.Timeout(2*time.Second))
	if err != nil {
		pgtest.Unavailable(t, "nats at %s: %v", testkit.NATSURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := "e2e" + strings.ReplaceAll(schema, "_", "")
	name := strings.ToUpper(prefix)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".orders"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	defer func() { _ = js.DeleteStream(context.Background(), name) }()

	const n = 200
	appOrders(t, pool, w, n, outbox.Message{Topic: "nowhere", Key: "poison", Payload: []byte("{}")})
	code, _, stderr := run(t, "run", "--sink", testkit.NATSURL()+"?subject="+prefix+".{topic}&stream="+name, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)

	var got []string
	ids := map[string]bool{}
	for seq := uint64(1); seq <= n+1; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		require.NoError(t, err, "message %d of %d", seq, n+1)
		got = append(got, string(m.Data))
		ids[m.Header.Get("Nats-Msg-Id")] = true
		if string(m.Data) != "after-poison" {
			require.Equal(t, "OrderPlaced", m.Header.Get("type"))
			require.Equal(t, "ü-✓", m.Header.Get("trace"))
			require.NotEmpty(t, m.Header.Get("outbox-key"))
		}
	}
	_, err = stream.GetMsg(ctx, n+2)
	require.True(t, errors.Is(err, jetstream.ErrMsgNotFound), "nothing more: %v", err)
	require.Len(t, ids, n+1, "one Nats-Msg-Id per message")
	require.NotContains(t, got, "rolled-back")
	require.Contains(t, got, "after-poison", "the poison message's key moved on")
	checkSeqOrder(t, got)
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "nowhere", dls[0].Topic)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Contains(t, *dls[0].LastError, "no stream")
}

// TestRunRedisEndToEnd relays through the real command line into a Redis
// stream of the shared server: every committed message once, in order per
// key, with its id, key, payload and headers as entry fields; a message
// whose stream key holds a string is dead-lettered with the server's
// WRONGTYPE reply while the other keys flow.
func TestRunRedisEndToEnd(t *testing.T) {
	pool, schema, w := e2e(t)
	opts, err := redis.ParseURL(testkit.RedisURL())
	require.NoError(t, err)
	opts.DisableIdentity = true
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		pgtest.Unavailable(t, "redis at %s: %v", testkit.RedisURL(), err)
	}
	prefix := "e2e:" + schema + ":"
	defer func() {
		iter := rdb.Scan(context.Background(), 0, prefix+"*", 100).Iterator()
		for iter.Next(context.Background()) {
			rdb.Del(context.Background(), iter.Val())
		}
	}()
	require.NoError(t, rdb.Set(ctx, prefix+"wrongtype", "a string, not a stream", 0).Err())

	const n = 200
	appOrders(t, pool, w, n, outbox.Message{Topic: "wrongtype", Key: "poison", Payload: []byte("{}")})
	code, _, stderr := run(t, "run", "--sink", testkit.RedisURL()+"?stream="+prefix+"{topic}", "--exit-when-empty")
	require.Equal(t, 0, code, stderr)

	entries, err := rdb.XRange(ctx, prefix+"orders", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, n+1, "every committed message once, except the poison one")
	var got []string
	ids := map[string]bool{}
	for _, e := range entries {
		payload := e.Values["payload"].(string)
		got = append(got, payload)
		ids[e.Values["id"].(string)] = true
		if payload != "after-poison" {
			require.Equal(t, "OrderPlaced", e.Values["type"])
			require.Equal(t, "ü-✓", e.Values["trace"])
			require.NotEmpty(t, e.Values["key"])
		}
	}
	require.Len(t, ids, n+1, "one id per message")
	require.NotContains(t, got, "rolled-back")
	require.Contains(t, got, "after-poison", "the poison message's key moved on")
	checkSeqOrder(t, got)
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "wrongtype", dls[0].Topic)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Contains(t, *dls[0].LastError, "WRONGTYPE")
}
