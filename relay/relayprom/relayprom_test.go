package relayprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/adminhttp"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, 20*time.Millisecond, func() (bool, string) { return cond(), msg })
}

// TestMetricsFollowRealTraffic runs a relay with the metrics hooks, the
// admin listener and a sink that fails some messages, and checks that
// each metric moves as the traffic says it should, and that /readyz turns
// 503 while the relay drains.
func TestMetricsFollowRealTraffic(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)

	sink := memory.New()
	sink.SetFail(func(m sinks.Message) error {
		switch string(m.Payload) {
		case "poison":
			return sinks.Permanent(errors.New("rejected"))
		case "flaky":
			if m.Attempt < 3 {
				return errors.New("busy")
			}
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	m := relayprom.New(reg, "test")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := 0; i < 20; i++ {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint("k", i), Payload: []byte("ok")})
	}
	msgs = append(msgs, outbox.Message{Topic: "t", Key: "p", Payload: []byte("poison")},
		outbox.Message{Topic: "t", Key: "f", Payload: []byte("flaky")})
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go m.WatchOutbox(watchCtx, pool, schema, 20*time.Millisecond, log)
	eventually(t, func() bool { return value(t, reg, "outbox_relay_pending_messages", nil) == 22 }, "pending gauge")
	require.Positive(t, value(t, reg, "outbox_relay_oldest_pending_age_seconds", nil))

	rpool, err := relay.NewPool(ctx, relay.PoolConfig{URL: pgtest.URL(), Workers: 2})
	require.NoError(t, err)
	defer rpool.Close()
	r, err := relay.New(rpool, sink, relay.Config{
		Schema: schema, PollInterval: 20 * time.Millisecond, RetryInitial: 10 * time.Millisecond,
		RetryMax: 20 * time.Millisecond, LeaseTTL: 3 * time.Second, Heartbeat: 100 * time.Millisecond,
		Hooks: m.Hooks("", "memory"), Logger: log,
	})
	require.NoError(t, err)
	reg.MustRegister(relayprom.NewStatsCollector(func() []*relay.Relay { return []*relay.Relay{r} }))
	srv, err := adminhttp.Start("127.0.0.1:0", reg, r, log, nil)
	require.NoError(t, err)
	defer srv.Close(ctx)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed assertion stops the relay, so that rpool.Close returns
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	eventually(t, func() bool { return value(t, reg, "outbox_relay_messages_published_total", nil) == 21 }, "published")
	require.Equal(t, 1.0, value(t, reg, "outbox_relay_messages_dead_lettered_total", map[string]string{"reason": "permanent"}))
	require.Equal(t, 0.0, value(t, reg, "outbox_relay_messages_dead_lettered_total", map[string]string{"reason": "max_attempts"}))
	require.Equal(t, 2.0, value(t, reg, "outbox_relay_retries_scheduled_total", nil))
	require.Equal(t, 2.0, value(t, reg, "outbox_relay_publish_errors_total", map[string]string{"reason": "retriable"}))
	require.Equal(t, 1.0, value(t, reg, "outbox_relay_publish_errors_total", map[string]string{"reason": "permanent"}))
	require.Equal(t, 21.0, value(t, reg, "outbox_relay_delivery_latency_seconds", nil), "one latency sample per delivered message")
	require.Positive(t, value(t, reg, "outbox_relay_batch_size_messages", nil))
	require.Equal(t, 256.0, value(t, reg, "outbox_relay_lanes_owned", nil))
	eventually(t, func() bool {
		return value(t, reg, "outbox_relay_pending_messages", nil) == 0 && value(t, reg, "outbox_relay_dead_letters", nil) == 1
	}, "backlog gauges after the drain")
	require.Equal(t, 0.0, value(t, reg, "outbox_relay_oldest_pending_age_seconds", nil))
	// The claims: at least one a batch, and, once drained, the workers'
	// 20 ms safety polls find nothing.
	batches := value(t, reg, "outbox_relay_batch_size_messages", nil)
	eventually(t, func() bool { return value(t, reg, "outbox_relay_empty_claims_total", nil) > 0 }, "empty claims")
	empty := value(t, reg, "outbox_relay_empty_claims_total", nil) // read first: both only grow
	claims := value(t, reg, "outbox_relay_claims_total", map[string]string{"lanes": "all"}) +
		value(t, reg, "outbox_relay_claims_total", map[string]string{"lanes": "named"})
	require.GreaterOrEqual(t, claims, batches+empty)
	require.GreaterOrEqual(t, value(t, reg, "outbox_relay_wakeups_total", nil), 0.0)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "metric names follow Prometheus conventions")

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/readyz")
	require.Equal(t, 200, code)
	code, _ = get("/livez")
	require.Equal(t, 200, code)
	code, body := get("/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, "outbox_relay_build_info")
	require.NoError(t, adminhttp.Probe(ctx, srv.Addr(), "/readyz"))

	// Drain: a slow in-flight batch keeps the relay draining while we look.
	sink.SetDelay(time.Second)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "t", Key: "slow", Payload: []byte("ok")}))
	require.NoError(t, tx.Commit(ctx))
	eventually(t, func() bool { return r.Stats().Claimed == 25 }, "slow batch claimed")
	cancel()
	// The relay turns draining from a callback of ctx's end: wait for it.
	eventually(t, func() bool {
		err := r.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "draining")
	}, "relay draining after its context ended")
	code, body = get("/readyz")
	require.Equal(t, 503, code)
	require.True(t, strings.Contains(body, "draining"), body)
	code, _ = get("/livez")
	require.Equal(t, 200, code, "a draining relay is still alive")
	require.Error(t, adminhttp.Probe(ctx, srv.Addr(), "/readyz"))
	require.NoError(t, <-done)
	require.EqualValues(t, 22, r.Stats().Delivered, "the in-flight batch finished during the drain")
}
