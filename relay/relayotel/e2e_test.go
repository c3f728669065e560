package relayotel_test

// End to end: an application writes messages inside a traced operation
// (a writer configured with outboxotel.TraceContext), a real relay
// (relay.New(...).Run on an isolated schema) publishes them through a real
// sink, and the consumer finds the writer's trace context in the
// traceparent header while the relay's producer span joins the writer's
// trace.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/outbox/outboxotel"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
)

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func tlog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// written is what the application wrote: the id of the traced message, its
// writer span, and the id of an untraced message.
type written struct {
	tracedID, untracedID string
	span                 trace.SpanContext
}

// writeTraced writes two messages on topic in one transaction: one inside
// a traced operation (its headers get the trace context from the writer's
// Headers hook), one without.
func writeTraced(t *testing.T, schema, topic string) written {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, Headers: outboxotel.TraceContext{}})
	require.NoError(t, err)

	// The application's own tracing, independent of the relay's.
	app := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = app.Shutdown(context.Background()) })
	spanCtx, span := app.Tracer("app").Start(ctx, "place order")
	defer span.End()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	// The writer stores the trace context of the context it is given.
	traced, err := w.Insert(spanCtx, tx,
		outbox.Message{Topic: topic, Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"x-tenant": "acme"}})
	require.NoError(t, err)
	untraced, err := w.Insert(ctx, tx,
		outbox.Message{Topic: topic, Key: "order-2", Payload: []byte(`{"n":2}`), Headers: map[string]string{"x-tenant": "acme"}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return written{tracedID: traced[0].MessageID, untracedID: untraced[0].MessageID, span: span.SpanContext()}
}

// runRelay runs a relay on schema with sink and tracing hooks until the
// test ends.
func runRelay(t *testing.T, schema string, sink sinks.Sink, hooks relay.Hooks) {
	t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: 1})
	require.NoError(t, err)
	r, err := relay.New(pool, sink, relay.Config{
		Schema:       schema,
		Workers:      1,
		PollInterval: 50 * time.Millisecond,
		LeaseTTL:     3 * time.Second,
		Heartbeat:    200 * time.Millisecond,
		Logger:       tlog(t),
		Hooks:        hooks,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop within 30s")
		}
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, sink.Close(ctx))
	})
}

// relaySpan waits for the relay's producer span and checks it continues
// the writer's trace.
func relaySpan(t *testing.T, rec *tracetest.SpanRecorder, w written, system, dest string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, 10*time.Millisecond, func() (bool, string) {
		return len(rec.Ended()) > 0, "no relay span"
	})
	spans := rec.Ended()
	require.Len(t, spans, 1, "one span: the untraced message gets none")
	s := spans[0]
	require.Equal(t, trace.SpanKindProducer, s.SpanKind())
	require.Equal(t, w.span.TraceID(), s.SpanContext().TraceID(), "same trace as the writer")
	require.Equal(t, w.span.SpanID(), s.Parent().SpanID(), "child of the writer's span")
	a := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		a[kv.Key] = kv.Value.Emit()
	}
	require.Equal(t, w.tracedID, a["messaging.message.id"])
	require.Equal(t, system, a["messaging.system"])
	require.Equal(t, dest, a["messaging.destination.name"])
	require.False(t, s.StartTime().After(s.EndTime()))
}

func wantTraceparent(w written) string {
	return "00-" + w.span.TraceID().String() + "-" + w.span.SpanID().String() + "-01"
}

func newRecorder(t *testing.T, system string) (*tracetest.SpanRecorder, *relayotel.Hooks) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h, err := relayotel.New(relayotel.Config{System: system, TracerProvider: tp})
	require.NoError(t, err)
	return rec, h
}

func TestE2EKafka(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	const topic = "orders"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		pgtest.Unavailable(t, "kfake cannot listen on loopback: %v", err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(cl.Close)

	w := writeTraced(t, schema, topic)
	sink, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), WriteTimeout: 10 * time.Second}, tlog(t))
	require.NoError(t, err)
	rec, hooks := newRecorder(t, "kafka")
	runRelay(t, schema, sink, hooks)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < 2 {
		fs := cl.PollRecords(ctx, 2-len(recs))
		require.NoError(t, ctx.Err(), "consumed %d of 2 records", len(recs))
		recs = append(recs, fs.Records()...)
	}
	for _, r := range recs {
		h := map[string]string{}
		for _, rh := range r.Headers {
			h[rh.Key] = string(rh.Value)
		}
		require.Equal(t, "acme", h["x-tenant"])
		switch h[kafkasink.HeaderMessageID] {
		case w.tracedID:
			require.Equal(t, wantTraceparent(w), h["traceparent"])
		case w.untracedID:
			require.NotContains(t, h, "traceparent")
		default:
			t.Fatalf("unexpected record %v", h)
		}
	}
	relaySpan(t, rec, w, "kafka", topic)
}

func TestE2EHTTP(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	var mu sync.Mutex
	got := map[string]http.Header{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got[r.Header.Get(httpsink.HeaderWebhookID)] = r.Header.Clone()
		mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)

	w := writeTraced(t, schema, "orders")
	sink, err := httpsink.New(httpsink.Config{URL: srv.URL + "/hook"}, tlog(t))
	require.NoError(t, err)
	rec, hooks := newRecorder(t, "webhook")
	runRelay(t, schema, sink, hooks)

	testkit.Eventually(t, 20*time.Second, 10*time.Millisecond, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2, fmt.Sprintf("received %d of 2 requests", len(got))
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, wantTraceparent(w), got[w.tracedID].Get("traceparent"))
	require.Empty(t, got[w.untracedID].Values("traceparent"))
	require.Equal(t, "acme", got[w.untracedID].Get("x-tenant"))
	relaySpan(t, rec, w, "webhook", "orders")
}
