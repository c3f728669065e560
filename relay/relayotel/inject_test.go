package relayotel_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/relay/relayotel"
)

func spanCtx(t *testing.T, state string) context.Context {
	t.Helper()
	tid, err := trace.TraceIDFromHex(traceID)
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(spanID)
	require.NoError(t, err)
	ts, err := trace.ParseTraceState(state)
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

func same(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// These tests touch the global propagator, so they do not run in parallel
// with each other (the hooks tests never read it).

func TestInjectNoSpan(t *testing.T) {
	h := map[string]string{"a": "b"}
	out := relayotel.Inject(context.Background(), h)
	require.True(t, same(h, out), "untouched: the same map")
	require.Nil(t, relayotel.Inject(context.Background(), nil))
}

func TestInjectDefaultPropagator(t *testing.T) {
	// The global propagator is the SDK's no-op default here.
	require.Empty(t, otel.GetTextMapPropagator().Fields())
	h := map[string]string{"a": "b"}
	out := relayotel.Inject(spanCtx(t, ""), h)
	require.Equal(t, map[string]string{"a": "b", "traceparent": traceparent("01")}, out)
	require.Equal(t, map[string]string{"a": "b"}, h, "the caller's map is not modified")

	out = relayotel.Inject(spanCtx(t, "vendor=abc,other=1"), nil)
	require.Equal(t, map[string]string{"traceparent": traceparent("01"), "tracestate": "vendor=abc,other=1"}, out)

	// An explicit traceparent wins.
	h = map[string]string{"Traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
	out = relayotel.Inject(spanCtx(t, ""), h)
	require.True(t, same(h, out))
}

// fakeB3 is a propagator without W3C Trace Context.
type fakeB3 struct{}

func (fakeB3) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	c.Set("b3", trace.SpanContextFromContext(ctx).TraceID().String())
}
func (fakeB3) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context { return ctx }
func (fakeB3) Fields() []string                                                          { return []string{"b3"} }

func TestInjectGlobalPropagator(t *testing.T) {
	restoreGlobals(t)

	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	m, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	bag, err := baggage.New(m)
	require.NoError(t, err)
	ctx := baggage.ContextWithBaggage(spanCtx(t, ""), bag)
	out := relayotel.Inject(ctx, nil)
	require.Equal(t, map[string]string{"traceparent": traceparent("01"), "baggage": "tenant=acme"}, out)

	// A propagator without Trace Context: traceparent is still written,
	// because that is what the relay reads.
	otel.SetTextMapPropagator(fakeB3{})
	out = relayotel.Inject(spanCtx(t, ""), nil)
	require.Equal(t, map[string]string{"traceparent": traceparent("01"), "b3": traceID}, out)
}
