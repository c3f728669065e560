package relayotel

import (
	"context"

	"github.com/outbox-relay/outbox-relay/outbox/outboxotel"
)

// Trace context headers (W3C Trace Context), as Inject writes them.
const (
	HeaderTraceparent = outboxotel.HeaderTraceparent
	HeaderTracestate  = outboxotel.HeaderTracestate
)

// Inject is outboxotel.Inject, for code that builds message headers
// itself (a writer configured with outboxotel.TraceContext calls it for
// every message).
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	return outboxotel.Inject(ctx, headers)
}
