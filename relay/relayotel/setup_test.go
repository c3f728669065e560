package relayotel_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/otlptest"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// restoreGlobals resets the global provider and propagator, which Setup
// replaces, to no-ops when the test ends. (The SDK's initial delegating
// globals cannot be put back.)
func restoreGlobals(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
}

// clearOTelEnv unsets every variable Setup or the SDK reads that a test
// here sets, so that the machine's environment does not leak in.
func clearOTelEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
		"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_METRIC_EXPORT_INTERVAL",
	} {
		t.Setenv(k, "")
	}
}

func setenv(t *testing.T, env map[string]string) {
	clearOTelEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// producer is what the relay exports: the relayprom metrics of a fresh
// registry, through the Prometheus bridge.
func producer(reg *prometheus.Registry) sdkmetric.Producer {
	return otelprom.NewMetricProducer(otelprom.WithGatherer(reg))
}

func TestSetupDisabled(t *testing.T) {
	restoreGlobals(t)
	cases := map[string]map[string]string{
		"no variable":          {},
		"sdk disabled":         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		"both exporters none":  {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
		"a protocol alone":     {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		"headers alone":        {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x", "OTEL_SERVICE_NAME": "x"},
		"metrics, no producer": {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318/v1/metrics", "OTEL_METRICS_EXPORTER": "otlp"},
	}
	for name, env := range cases {
		t.Run(name, func(t *testing.T) {
			setenv(t, env)
			var opts []relayotel.Option
			if name != "metrics, no producer" {
				opts = append(opts, relayotel.WithMetricProducer(producer(prometheus.NewRegistry())))
			}
			before := otel.GetTracerProvider()
			shutdown, enabled, err := relayotel.Setup(context.Background(), opts...)
			require.NoError(t, err)
			require.Equal(t, relayotel.Signals{}, enabled)
			require.NoError(t, shutdown(context.Background()))
			require.Equal(t, before, otel.GetTracerProvider(), "nothing installed")
		})
	}
}

// TestSetupSignals: an exporter variable, or an endpoint when it is
// unset, turns each signal on, independently.
func TestSetupSignals(t *testing.T) {
	restoreGlobals(t)
	rcv := otlptest.Start(t)
	cases := []struct {
		name string
		env  map[string]string
		want relayotel.Signals
	}{
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint}, relayotel.Signals{Traces: true, Metrics: true}},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rcv.HTTPEndpoint + "/v1/traces"}, relayotel.Signals{Traces: true}},
		{"metrics endpoint", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": rcv.HTTPEndpoint + "/v1/metrics"}, relayotel.Signals{Metrics: true}},
		{"metrics none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint, "OTEL_METRICS_EXPORTER": "none"}, relayotel.Signals{Traces: true}},
		{"traces none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.GRPCEndpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "none"}, relayotel.Signals{Metrics: true}},
		{"console alone", map[string]string{"OTEL_METRICS_EXPORTER": "console"}, relayotel.Signals{Metrics: true}},
		{"exporter without endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, relayotel.Signals{Traces: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setenv(t, tc.env)
			var console bytes.Buffer
			shutdown, enabled, err := relayotel.Setup(context.Background(),
				relayotel.WithMetricProducer(producer(prometheus.NewRegistry())), relayotel.WithConsoleWriter(&console))
			require.NoError(t, err)
			require.Equal(t, tc.want, enabled)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, shutdown(ctx))
		})
	}
}

func TestSetupErrors(t *testing.T) {
	restoreGlobals(t)
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"}, `OTEL_EXPORTER_OTLP_PROTOCOL="http/xml" is not supported`},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpcs"}, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER="zipkin" is not supported`},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp,none"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER=\"prometheus\": the relay serves Prometheus metrics on its admin listener's /metrics"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:s3cret@collector/x"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "127.0.0.1:4317"}, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT must be"},
	}
	for _, tc := range cases {
		setenv(t, tc.env)
		_, enabled, err := relayotel.Setup(context.Background(), relayotel.WithMetricProducer(producer(prometheus.NewRegistry())))
		require.ErrorContains(t, err, tc.want, "%v", tc.env)
		require.ErrorContains(t, err, "outbox: opentelemetry: ")
		require.NotContains(t, err.Error(), "s3cret")
		require.Equal(t, relayotel.Signals{}, enabled)
	}
}

// TestSetupExports: with an endpoint set, spans made by Hooks on the
// global provider reach an OTLP/HTTP receiver, with the service name and
// version, and the OTEL_* variables are honoured.
func TestSetupExports(t *testing.T) {
	restoreGlobals(t)
	rcv := otlptest.Start(t)

	run := func(t *testing.T) []otlptest.Span {
		t.Helper()
		rcv.Reset()
		shutdown, enabled, err := relayotel.Setup(context.Background(), relayotel.WithServiceVersion("1.2.3"))
		require.NoError(t, err)
		require.Equal(t, relayotel.Signals{Traces: true}, enabled, "no metrics without a producer")
		h, err := relayotel.New(relayotel.Config{System: "kafka"}) // global provider
		require.NoError(t, err)
		now := time.Now()
		h.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(7)}, Start: now.Add(-time.Millisecond), End: now})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, shutdown(ctx), "shutdown flushes")
		return rcv.Spans()
	}

	t.Run("defaults", func(t *testing.T) {
		setenv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0ken"})
		got := run(t)
		require.Len(t, got, 1)
		require.Equal(t, "outbox-relay", got[0].Resource["service.name"])
		require.Equal(t, "1.2.3", got[0].Resource["service.version"])
		require.Equal(t, "opentelemetry", got[0].Resource["telemetry.sdk.name"])
		s := got[0]
		require.Equal(t, "send orders", s.Name)
		require.Equal(t, tracepb.Span_SPAN_KIND_PRODUCER, s.Kind)
		require.Equal(t, spanID, hexID(s.ParentSpanId))
		require.Equal(t, traceID, hexID(s.TraceId))
		exports := rcv.Exports()
		require.Len(t, exports, 1)
		require.Equal(t, "/v1/traces", exports[0].Path)
		require.Equal(t, "Bearer t0ken", exports[0].Header["authorization"])
		// The propagator Setup installs writes W3C Trace Context.
		require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())
	})

	t.Run("env overrides", func(t *testing.T) {
		setenv(t, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1", // overridden below
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rcv.HTTPEndpoint + "/custom/path",
			"OTEL_SERVICE_NAME":                  "billing-relay",
			"OTEL_RESOURCE_ATTRIBUTES":           "deployment.environment.name=test,service.version=9",
		})
		got := run(t)
		require.Len(t, got, 1)
		require.Equal(t, "billing-relay", got[0].Resource["service.name"])
		require.Equal(t, "9", got[0].Resource["service.version"])
		require.Equal(t, "test", got[0].Resource["deployment.environment.name"])
		require.Equal(t, "/custom/path", rcv.Exports()[0].Path)
	})

	t.Run("sampler", func(t *testing.T) {
		setenv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint, "OTEL_TRACES_SAMPLER": "always_off"})
		require.Empty(t, run(t))
	})

	t.Run("grpc", func(t *testing.T) {
		setenv(t, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.GRPCEndpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0ken",
		})
		got := run(t)
		require.Len(t, got, 1)
		require.Equal(t, "send orders", got[0].Name)
		exports := rcv.Exports()
		require.Equal(t, "grpc", exports[0].Transport)
		require.Equal(t, "/opentelemetry.proto.collector.trace.v1.TraceService/Export", exports[0].Path)
		require.Equal(t, "Bearer t0ken", exports[0].Header["authorization"])
	})
}

// TestSetupExportsMetrics: the relayprom metrics, read through the
// Prometheus bridge, reach an OTLP receiver over HTTP and over gRPC with
// the names, descriptions, types, labels and histogram buckets of the
// Prometheus endpoint.
func TestSetupExportsMetrics(t *testing.T) {
	restoreGlobals(t)
	rcv := otlptest.Start(t)
	for _, tc := range []struct{ protocol, endpoint, path string }{
		{"http/protobuf", rcv.HTTPEndpoint, "/v1/metrics"},
		{"grpc", rcv.GRPCEndpoint, "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			rcv.Reset()
			setenv(t, map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": tc.protocol,
				"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "Authorization=Bearer%20m",
			})
			reg := prometheus.NewRegistry()
			hooks := relayprom.New(reg, "1.2.3").Hooks("orders", "kafka")
			shutdown, enabled, err := relayotel.Setup(context.Background(), relayotel.WithServiceVersion("1.2.3"), relayotel.WithMetricProducer(producer(reg)))
			require.NoError(t, err)
			require.Equal(t, relayotel.Signals{Metrics: true}, enabled)
			hooks.Batch(relay.BatchEvent{Claimed: 3, Delivered: 3, Committed: true, SendDuration: 30 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, shutdown(ctx), "shutdown exports a last time")

			exports := rcv.Exports()
			require.NotEmpty(t, exports)
			require.Equal(t, tc.path, exports[0].Path)
			require.Equal(t, "Bearer m", exports[0].Header["authorization"])
			checkRelayMetrics(t, rcv)
		})
	}
}

// checkRelayMetrics checks what the receiver got of one batch of three
// messages delivered on route orders to kafka.
func checkRelayMetrics(t *testing.T, rcv *otlptest.Receiver) {
	t.Helper()
	route := map[string]string{"route": "orders", "sink": "kafka"}

	published := last(t, rcv, "outbox_relay_messages_published_total")
	require.Equal(t, "outbox-relay", published.Resource["service.name"])
	require.Equal(t, "1.2.3", published.Resource["service.version"])
	require.Equal(t, "go.opentelemetry.io/contrib/bridges/prometheus", published.Scope)
	require.Equal(t, "Messages the sink accepted.", published.Description, "the help text")
	require.Empty(t, published.Unit, "the unit is in the name, as in Prometheus")
	sum := published.GetSum()
	require.NotNil(t, sum, "a counter is a sum")
	require.True(t, sum.IsMonotonic)
	require.Equal(t, metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE, sum.AggregationTemporality)
	v, ok := published.Value(route)
	require.True(t, ok, "the route and sink labels are attributes")
	require.Equal(t, 3.0, v)

	lanes := last(t, rcv, "outbox_relay_lanes_owned")
	require.NotNil(t, lanes.GetGauge(), "a gauge is a gauge")
	build := last(t, rcv, "outbox_relay_build_info")
	v, ok = build.Value(map[string]string{"version": "1.2.3"})
	require.True(t, ok)
	require.Equal(t, 1.0, v)

	dur := last(t, rcv, "outbox_relay_publish_duration_seconds")
	hist := dur.GetHistogram()
	require.NotNil(t, hist, "a histogram is a histogram")
	require.Equal(t, metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE, hist.AggregationTemporality)
	require.Len(t, hist.DataPoints, 1)
	p := hist.DataPoints[0]
	require.Equal(t, route, otlptest.Attrs(p.Attributes))
	require.Equal(t, uint64(1), p.Count)
	require.InDelta(t, 0.03, p.GetSum(), 1e-9)
	require.Equal(t, []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}, p.ExplicitBounds,
		"the Prometheus buckets")
	require.Len(t, p.BucketCounts, len(p.ExplicitBounds)+1)
	require.Equal(t, uint64(1), p.BucketCounts[5], "30ms falls in (0.025, 0.05]")
}

// last returns the latest export of the metric name.
func last(t *testing.T, rcv *otlptest.Receiver, name string) otlptest.Metric {
	t.Helper()
	ms := rcv.Metrics(name)
	require.NotEmpty(t, ms, "no %s exported", name)
	return ms[len(ms)-1]
}

// TestSetupConsole: the console exporters write to WithConsoleWriter.
func TestSetupConsole(t *testing.T) {
	restoreGlobals(t)
	setenv(t, map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"})
	reg := prometheus.NewRegistry()
	hooks := relayprom.New(reg, "1.2.3").Hooks("orders", "kafka")
	var out testkit.SyncBuffer
	shutdown, enabled, err := relayotel.Setup(context.Background(), relayotel.WithMetricProducer(producer(reg)), relayotel.WithConsoleWriter(&out))
	require.NoError(t, err)
	require.Equal(t, relayotel.Signals{Traces: true, Metrics: true}, enabled)
	hooks.Batch(relay.BatchEvent{Claimed: 1, Delivered: 1, Committed: true})
	h, err := relayotel.New(relayotel.Config{System: "kafka"})
	require.NoError(t, err)
	now := time.Now()
	h.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(7)}, Start: now.Add(-time.Millisecond), End: now})
	require.NoError(t, shutdown(context.Background()))
	require.Contains(t, out.String(), `"Name":"send orders"`)
	require.Contains(t, out.String(), `"Name":"outbox_relay_messages_published_total"`)
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&0xf])
	}
	return string(out)
}
