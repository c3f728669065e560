package faults

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// outageRun runs the relay binary with sinkURL while a steady writer
// writes, kills the server (SIGKILL) a second in, keeps it down for
// outageLength() and starts it again on the same port and data; it
// returns the payloads written, once everything is delivered.
func outageRun(t *testing.T, srv *throwaway.Server, sinkURL string) (written []string, downtime time.Duration) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	cfg := outageConfig
	p := startRelay(t, pgtest.URL(), schema, "--sink", sinkURL,
		"--batch-size", fmt.Sprint(cfg.BatchSize), "--max-attempts", fmt.Sprint(cfg.MaxAttempts),
		"--retry-initial", cfg.RetryInitial.String(), "--retry-multiplier", fmt.Sprint(cfg.RetryMultiplier),
		"--retry-max", cfg.RetryMax.String(), "--retry-jitter", fmt.Sprint(cfg.RetryJitter))
	w := startSteadyWriter(t, pool, schema, map[string]string{"type": "OrderPlaced"})
	p.publishedMore(100) // steady state first
	downAt := time.Now()
	srv.Kill()
	w.writeMore(t, outageWrites(), nil)
	srv.Start()
	downtime = time.Since(downAt)
	upAt := time.Now()
	p.publishedMore(100) // the writer goes on until the relay delivers again
	written = w.stop()
	eventually(t, drainBound(), 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")
	t.Logf("server down %s; %d written, all delivered %s after the restart; relay log lines at WARN: %d",
		downtime.Round(time.Millisecond), len(written), time.Since(upAt).Round(time.Millisecond), p.logs.Count(`"level":"WARN"`))
	return written, downtime
}

// TestNATSOutage kills a throwaway nats-server -js under the relay binary
// for outageLength() while applications keep writing: nothing is lost,
// per-key order holds, and the stream holds every message exactly once
// (the relay's redeliveries fall inside the duplicate window).
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBound())
	defer cancel()
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	nc.Close()

	sinkURL := srv.URL() + "?" + url.Values{"stream": {"ORDERS"}, "reconnect_initial": {"100ms"}, "reconnect_max": {"500ms"}}.Encode()
	written, _ := outageRun(t, srv, sinkURL)

	nc, err = nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err = jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "ORDERS")
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	// An ordered consumer reads the stream in batches (a request a
	// message took most of an hour for a 10-minute outage's backlog).
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var got []delivery
	for uint64(len(got)) < info.State.Msgs {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			got = append(got, delivery{ID: m.Headers().Get("Nats-Msg-Id"), Payload: string(m.Data())})
			n++
		}
		require.NoError(t, batch.Error())
		require.Positive(t, n, "the stream's read stalled at %d of %d messages", len(got), info.State.Msgs)
	}
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	t.Logf("NATS: %d messages in the stream for %d written: %d duplicates", len(got), len(written), dups)
	require.Zero(t, dups, "redeliveries inside the duplicate window are dropped by the server")
}

// TestRedisOutage kills a throwaway redis-server (with an append-only
// file) under the relay binary for outageLength() while applications keep
// writing: nothing is lost and per-key order holds. Redis has no
// deduplication: duplicates are counted, and carry the same id.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBound())
	defer cancel()
	written, _ := outageRun(t, srv, srv.URL()+"?dial_timeout=500ms")

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer rdb.Close()
	// In pages: one XRANGE of a 10-minute outage's 240,000 entries
	// outlasts the client's read timeout.
	const page = 10_000
	var got []delivery
	for start := "-"; ; {
		entries, err := rdb.XRangeN(ctx, "orders", start, "+", page).Result()
		require.NoError(t, err)
		for _, e := range entries {
			id, _ := e.Values["id"].(string)
			payload, _ := e.Values["payload"].(string)
			got = append(got, delivery{ID: id, Payload: payload})
		}
		if len(entries) < page {
			break
		}
		start = "(" + entries[len(entries)-1].ID
	}
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	t.Logf("Redis: %d entries for %d written: %d duplicates", len(got), len(written), dups)
}
