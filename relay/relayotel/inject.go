package relayotel

import (
	"context"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Trace context headers (W3C Trace Context), as Inject writes them.
const (
	HeaderTraceparent = outbox.HeaderTraceparent
	HeaderTracestate  = outbox.HeaderTracestate
)

// Inject is outbox.InjectTraceContext, for code that builds message headers
// itself (the outbox writer already calls it).
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	return outbox.InjectTraceContext(ctx, headers)
}
