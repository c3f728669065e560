package relayotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// collector is a minimal OTLP/HTTP receiver: it decodes the protobuf
// export requests it is sent.
type collector struct {
	srv   *httptest.Server
	mu    sync.Mutex
	paths []string
	reqs  []*collectorpb.ExportTraceServiceRequest
	auth  []string
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		req := &collectorpb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.paths = append(c.paths, r.URL.Path)
		c.reqs = append(c.reqs, req)
		c.auth = append(c.auth, r.Header.Get("Authorization"))
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(mustMarshal(&collectorpb.ExportTraceServiceResponse{}))
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func mustMarshal(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	return b
}

type exported struct {
	resource map[string]string
	span     *tracepb.Span
}

func (c *collector) spans() []exported {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []exported
	for _, req := range c.reqs {
		for _, rs := range req.ResourceSpans {
			res := map[string]string{}
			for _, kv := range rs.Resource.GetAttributes() {
				res[kv.Key] = kv.Value.GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out = append(out, exported{res, s})
				}
			}
		}
	}
	return out
}

// restoreGlobals resets the global provider and propagator, which Setup
// replaces, to no-ops when the test ends. (The SDK's initial delegating
// globals cannot be put back.)
func restoreGlobals(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
}

func clearOTelEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	} {
		t.Setenv(k, "")
	}
}

func TestSetupDisabled(t *testing.T) {
	restoreGlobals(t)
	cases := map[string]map[string]string{
		"no endpoint":           {},
		"sdk disabled":          {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		"traces exporter none":  {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
		"only a metrics config": {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318/v1/metrics"},
	}
	for name, env := range cases {
		t.Run(name, func(t *testing.T) {
			clearOTelEnv(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			before := otel.GetTracerProvider()
			shutdown, enabled, err := relayotel.Setup(context.Background())
			require.NoError(t, err)
			require.False(t, enabled)
			require.NoError(t, shutdown(context.Background()))
			require.Equal(t, before, otel.GetTracerProvider(), "nothing installed")
		})
	}
}

func TestSetupErrors(t *testing.T) {
	restoreGlobals(t)
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:s3cret@collector/x"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be"},
	}
	for _, tc := range cases {
		clearOTelEnv(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		_, enabled, err := relayotel.Setup(context.Background())
		require.ErrorContains(t, err, tc.want, "%v", tc.env)
		require.ErrorContains(t, err, "outbox: tracing")
		require.NotContains(t, err.Error(), "s3cret")
		require.False(t, enabled)
	}
}

// TestSetupExports: with an endpoint set, spans made by Hooks on the
// global provider reach an OTLP/HTTP receiver, with the service name and
// version, and the OTEL_* variables are honoured.
func TestSetupExports(t *testing.T) {
	restoreGlobals(t)
	c := newCollector(t)

	run := func(t *testing.T) []exported {
		t.Helper()
		shutdown, enabled, err := relayotel.Setup(context.Background(), relayotel.WithServiceVersion("1.2.3"))
		require.NoError(t, err)
		require.True(t, enabled)
		h, err := relayotel.New(relayotel.Config{System: "kafka"}) // global provider
		require.NoError(t, err)
		now := time.Now()
		h.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(7)}, Start: now.Add(-time.Millisecond), End: now})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, shutdown(ctx), "shutdown flushes")
		return c.spans()
	}

	t.Run("defaults", func(t *testing.T) {
		clearOTelEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.srv.URL)
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20t0ken")
		got := run(t)
		require.Len(t, got, 1)
		require.Equal(t, "outbox-relay", got[0].resource["service.name"])
		require.Equal(t, "1.2.3", got[0].resource["service.version"])
		require.Equal(t, "opentelemetry", got[0].resource["telemetry.sdk.name"])
		s := got[0].span
		require.Equal(t, "send orders", s.Name)
		require.Equal(t, tracepb.Span_SPAN_KIND_PRODUCER, s.Kind)
		require.Equal(t, spanID, hexID(s.ParentSpanId))
		require.Equal(t, traceID, hexID(s.TraceId))
		c.mu.Lock()
		require.Equal(t, []string{"/v1/traces"}, c.paths)
		require.Equal(t, []string{"Bearer t0ken"}, c.auth)
		c.mu.Unlock()
		// The propagator Setup installs writes W3C Trace Context.
		require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())
	})

	t.Run("env overrides", func(t *testing.T) {
		clearOTelEnv(t)
		c.mu.Lock()
		c.reqs, c.paths = nil, nil
		c.mu.Unlock()
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // overridden below
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.srv.URL+"/custom/path")
		t.Setenv("OTEL_SERVICE_NAME", "billing-relay")
		t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test,service.version=9")
		got := run(t)
		require.Len(t, got, 1)
		require.Equal(t, "billing-relay", got[0].resource["service.name"])
		require.Equal(t, "9", got[0].resource["service.version"])
		require.Equal(t, "test", got[0].resource["deployment.environment.name"])
		c.mu.Lock()
		require.Equal(t, []string{"/custom/path"}, c.paths)
		c.mu.Unlock()
	})

	t.Run("sampler", func(t *testing.T) {
		clearOTelEnv(t)
		c.mu.Lock()
		c.reqs, c.paths = nil, nil
		c.mu.Unlock()
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.srv.URL)
		t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
		require.Empty(t, run(t))
	})
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&0xf])
	}
	return string(out)
}
