// Package outboxotel stores the OpenTelemetry trace context of the writing
// operation in the headers of outbox messages, so that the relay's publish
// span (relay/relayotel) and the consumer continue the writer's trace:
//
//	w, err := outbox.NewWriter(outbox.WriterConfig{Headers: outboxotel.TraceContext{}})
//
// It is the writer's only link to OpenTelemetry; package outbox itself
// does not import it. See docs/tracing.md.
package outboxotel

import (
	"context"
	"maps"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context headers (W3C Trace Context), as Inject writes them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// TraceContext is the outbox.HeaderInjector that calls Inject for every
// message written. The zero value is ready to use.
type TraceContext struct{}

// InjectHeaders is Inject.
func (TraceContext) InjectHeaders(ctx context.Context, headers map[string]string) map[string]string {
	return Inject(ctx, headers)
}

// Inject returns headers with the trace context of ctx added, for a
// message written inside a traced operation: the relay makes the
// message's publish span a child of it, and the sinks deliver the headers
// to consumers, whose instrumentation continues the trace. A writer
// configured with TraceContext calls it for every message; only the
// OpenTelemetry API is used, so an application without tracing pays one
// context lookup.
//
// It uses the global propagator (otel.GetTextMapPropagator), so baggage
// travels too when the application installed a baggage propagator, and
// always writes W3C traceparent (plus tracestate when non-empty), the
// format the relay reads. When ctx carries no valid span, or headers
// already hold a traceparent (set on purpose, for example to continue the
// trace of a message being forwarded), headers is returned untouched;
// otherwise the result is a copy and headers itself is not modified.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	for k := range headers {
		if strings.EqualFold(k, HeaderTraceparent) {
			return headers
		}
	}
	out := make(map[string]string, len(headers)+2)
	maps.Copy(out, headers)
	carrier := propagation.MapCarrier(out)
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	if _, ok := out[HeaderTraceparent]; !ok {
		// The global propagator is the default no-op, or one without
		// W3C Trace Context (B3 only, say).
		propagation.TraceContext{}.Inject(ctx, carrier)
	}
	return out
}
