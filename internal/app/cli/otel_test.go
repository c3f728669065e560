package cli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/otlptest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/outbox/outboxotel"
)

// Issue 51: with OTEL_METRICS_EXPORTER=otlp and the standard OTLP
// variables, `run` exports the spans of its deliveries and the metrics of
// its Prometheus endpoint, by the same names, to an OTLP receiver, over
// gRPC and over HTTP; /metrics stays as it was.
func TestRunExportsOpenTelemetry(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
	for _, tc := range []struct{ protocol, endpoint string }{
		{"grpc", rcv.GRPCEndpoint},
		{"http/protobuf", rcv.HTTPEndpoint},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			rcv.Reset()
			for k, v := range map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol,
				"OTEL_METRICS_EXPORTER": "otlp", "OTEL_TRACES_EXPORTER": "", // traces: on by the endpoint
				"OTEL_METRIC_EXPORT_INTERVAL": "100", "OTEL_BSP_SCHEDULE_DELAY": "50",
				"OTEL_SDK_DISABLED": "", "OTEL_SERVICE_NAME": "", "OTEL_RESOURCE_ATTRIBUTES": "",
			} {
				t.Setenv(k, v)
			}
			runExportsOpenTelemetry(t, rcv)
		})
	}
}

func runExportsOpenTelemetry(t *testing.T, rcv *otlptest.Receiver) {
	pool, schema, _ := e2e(t)
	sink := testkit.NewTestReceiver(t, nil)

	// The application writes one message inside a traced operation.
	app := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = app.Shutdown(context.Background()) })
	ctx, span := app.Tracer("app").Start(context.Background(), "place order")
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, Headers: outboxotel.TraceContext{}})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx,
		outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte(`{"n":1}`)},
		outbox.Message{Topic: "orders", Key: "o-2", Payload: []byte(`{"n":2}`)}))
	require.NoError(t, tx.Commit(ctx))
	span.End()

	b := runInBackground(t, "run", "--sink", sink.URL())
	delivered := map[string]string{"route": "", "sink": "http"}
	rcv.Await(t, 30*time.Second, func() (bool, string) {
		spans := rcv.Spans()
		for _, m := range rcv.Metrics("outbox_relay_messages_published_total") {
			if v, _ := m.Value(delivered); v == 2 && len(spans) >= 2 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d exports, %d spans; sink accepted %d; logs:\n%s",
			len(rcv.Exports()), len(spans), sink.Accepted(), b.logs.String())
	})

	spans := rcv.Spans()
	require.Len(t, spans, 2, "one producer span per message")
	for _, s := range spans {
		require.Equal(t, "send orders", s.Name)
		require.Equal(t, tracepb.Span_SPAN_KIND_PRODUCER, s.Kind)
		require.Equal(t, "outbox-relay", s.Resource["service.name"])
		require.Equal(t, span.SpanContext().TraceID(), trace.TraceID(s.TraceId), "the writer's trace")
		require.Equal(t, span.SpanContext().SpanID(), trace.SpanID(s.ParentSpanId), "child of the writer's span")
		require.Equal(t, "webhook", otlptest.Attrs(s.Attributes)["messaging.system"])
	}

	m := rcv.Metrics("outbox_relay_messages_published_total")[0]
	require.Equal(t, "outbox-relay", m.Resource["service.name"])
	require.True(t, m.GetSum().GetIsMonotonic(), "a counter is a monotonic sum")
	// The backlog gauges are refreshed with no scrape of /metrics too.
	require.NotEmpty(t, rcv.Metrics("outbox_relay_pending_messages"))
	require.NotEmpty(t, rcv.Metrics("outbox_relay_delivery_latency_seconds")[0].GetHistogram())
	require.NotEmpty(t, rcv.Metrics("outbox_relay_ready"), "the collectors registered after Setup too")

	// The Prometheus endpoint, beside it, is unchanged.
	resp, err := http.Get("http://" + b.addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "# TYPE outbox_relay_messages_published_total counter\n")
	require.Contains(t, string(body), `outbox_relay_messages_published_total{route="",sink="http"} 2`+"\n")

	// Stopping exports a last time: the final point holds every delivery.
	rcv.Reset()
	require.Equal(t, 0, b.stop(), b.logs.String())
	final := rcv.Metrics("outbox_relay_messages_published_total")
	require.NotEmpty(t, final, "shutdown exported the metrics")
	v, ok := final[len(final)-1].Value(delivered)
	require.True(t, ok)
	require.Equal(t, 2.0, v)
	// (A periodic export under way when the stop came is cancelled, and the
	// SDK reports it: "opentelemetry: error … context canceled".)
	require.NotContains(t, b.logs.String(), "opentelemetry: flushing at exit", "the last export succeeded")
	require.False(t, strings.Contains(b.logs.String(), "level=ERROR"), b.logs.String())
}

// Without an admin listener the backlog gauges are refreshed all the same
// when OpenTelemetry exports the metrics: they are read there.
func TestRunExportsTheBacklogWithoutAdminListener(t *testing.T) {
	rcv := otlptest.Start(t)
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": rcv.GRPCEndpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_METRIC_EXPORT_INTERVAL": "100", "OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": "",
		"OTEL_METRICS_EXPORTER": "", "OTEL_SDK_DISABLED": "",
	} {
		t.Setenv(k, v)
	}
	pool, _, w := e2e(t)
	t.Setenv("OUTBOX_ADMIN_ADDR", "")
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "later", Payload: []byte("{}"), DeliverAfter: time.Hour}))
	require.NoError(t, tx.Commit(ctx))

	runCtx, stop := context.WithCancel(ctx)
	logs := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(runCtx, []string{"run", "--sink", "discard", "--metrics-interval", "100ms"}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()
	rcv.Await(t, 30*time.Second, func() (bool, string) {
		for _, m := range rcv.Metrics("outbox_relay_delayed_messages") {
			if v, _ := m.Value(nil); v == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no export with outbox_relay_delayed_messages 1 in %d; logs:\n%s", len(rcv.Exports()), logs.String())
	})
	require.Empty(t, rcv.Spans(), "no traces: only the metrics endpoint is set")
}

// An OTEL_* value the relay cannot honour is a usage error naming it.
func TestRunRefusesAnOpenTelemetryValueItCannotHonour(t *testing.T) {
	e2e(t)
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_METRICS_EXPORTER", "prometheus")
	code, _, stderr := run(t, "run", "--sink", "discard")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `outbox: opentelemetry: OTEL_METRICS_EXPORTER="prometheus"`)
}
