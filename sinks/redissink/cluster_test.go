package redissink

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// TestCluster sends batches whose messages go to streams on every node of
// a three-node Redis Cluster of the test's own: every entry lands once,
// in order per stream, and a WRONGTYPE on one slot stops only its key.
func TestCluster(t *testing.T) {
	t.Parallel()
	u := throwaway.RedisCluster(t, 3)
	s, err := New(Config{URL: u, Cluster: true, PublishTimeout: 10 * time.Second}, slog.New(slog.NewTextHandler(testkit.LogWriter(t), nil)))
	require.NoError(t, err)
	defer s.Close(context.Background())
	ctx := context.Background()
	var batch []sinks.Message
	topics := []string{"c:a", "c:b", "c:c", "c:d", "c:e", "c:f"}
	for i := range 300 {
		batch = append(batch, sinktest.Msg(topics[i%len(topics)], fmt.Sprintf("k%d", i%7), int64(i+1), fmt.Appendf(nil, "%d", i)))
	}
	require.NoError(t, s.Send(ctx, batch))
	srv, err := parseServer(u, true)
	require.NoError(t, err)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: srv.Addrs, DisableIdentity: true})
	defer cc.Close()
	slots := map[int]bool{}
	for _, topic := range topics {
		slots[slot(topic)] = true
		es, err := cc.XRange(ctx, topic, "-", "+").Result()
		require.NoError(t, err)
		var want []string
		for _, m := range batch {
			if m.Topic == topic {
				want = append(want, m.ID)
			}
		}
		var got []string
		for _, e := range es {
			got = append(got, e.Values["id"].(string))
		}
		require.Equal(t, want, got, "stream %s", topic)
	}
	t.Logf("%d streams on %d slots", len(topics), len(slots))

	require.NoError(t, cc.Set(ctx, "c:bad", "x", 0).Err())
	bad := []sinks.Message{
		sinktest.Msg("c:bad", "k1", 1, []byte("1")),
		sinktest.Msg("c:a", "k1", 2, []byte("2")),
		sinktest.Msg("c:b", "k2", 3, []byte("3")),
	}
	err = s.Send(ctx, bad)
	require.True(t, sinks.IsPermanent(sinks.Outcome(err, 0, 3)), "%v", err)
	require.ErrorIs(t, sinks.Outcome(err, 1, 3), sinks.ErrNotAttempted)
	require.NoError(t, sinks.Outcome(err, 2, 3))
}
