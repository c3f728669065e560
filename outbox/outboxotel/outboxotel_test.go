package outboxotel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/outbox/outboxotel"
)

var _ outbox.HeaderInjector = outboxotel.TraceContext{}

// The hook adds the W3C traceparent of a traced context and leaves an
// untraced write alone; Inject's rules are tested in relay/relayotel
// (relayotel.Inject is Inject).
func TestTraceContextInjectsTraceparent(t *testing.T) {
	t.Parallel()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	h := map[string]string{"type": "OrderPlaced"}
	require.Equal(t, map[string]string{"type": "OrderPlaced", outboxotel.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		outboxotel.TraceContext{}.InjectHeaders(ctx, h))
	require.Equal(t, map[string]string{"type": "OrderPlaced"}, h, "the caller's map is not modified")
	require.Equal(t, h, outboxotel.TraceContext{}.InjectHeaders(context.Background(), h))
}
