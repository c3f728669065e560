package relay

import (
	"time"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// BatchEvent describes one claim-publish-settle cycle of a worker.
type BatchEvent struct {
	Worker int
	// Claimed is how many messages the claim returned.
	Claimed int
	// Delivered, Retried and DeadLettered count the settled outcomes;
	// Untouched counts messages held back because an earlier message of
	// their key failed in the same batch.
	Delivered, Retried, DeadLettered, Untouched int
	// Messages are the claimed messages in the order handed to the sink;
	// sinks.Outcome(SendErr, i, len(Messages)) is the answer for
	// Messages[i]. Read-only.
	Messages []sinks.Message
	// DeliveredMessages are the messages the sink accepted (for latency).
	DeliveredMessages []sinks.Message
	// DeadReasons has one entry per dead-lettered message: "permanent" or
	// "max_attempts".
	DeadReasons                                 []string
	ClaimDuration, SendDuration, SettleDuration time.Duration
	// SendStart is when the batch was handed to the sink (relay clock).
	SendStart time.Time
	// SendErr is what the sink returned (nil when all were delivered).
	SendErr error
	// Committed is false when settling failed: delivered messages will be
	// delivered again (at-least-once).
	Committed bool
	// AckedAt is when the sink accepted the batch, on the database's clock
	// (the relay's clock corrected by the offset seen at claim time), so
	// AckedAt.Sub(m.CreatedAt) is a commit-to-ack latency free of clock skew.
	AckedAt time.Time
}

// Hooks observe a relay. Implementations must be fast and safe for
// concurrent use; they run on the workers' goroutines.
type Hooks interface {
	Batch(ev BatchEvent)
	Lanes(owned int)
}

// CycleErrorHooks is implemented by hooks that also want to know about
// cycles that failed before a batch could be settled (database
// unreachable or read-only, connection lost): no BatchEvent reports
// those.
type CycleErrorHooks interface {
	CycleError(err error)
}

// LaneHealthHooks is implemented by hooks that want to know, at every
// heartbeat, how many lanes of the relay's route no live relay has worked
// for longer than a lease TTL (0 when all are worked): lanes whose
// messages wait although the relay itself is healthy.
type LaneHealthHooks interface {
	UnworkedLanes(n int)
}

// NopHooks ignores everything.
type NopHooks struct{}

func (NopHooks) Batch(BatchEvent) {}
func (NopHooks) Lanes(int)        {}

// MultiHooks calls every hook in turn (metrics and tracing together).
func MultiHooks(hs ...Hooks) Hooks { return multiHooks(hs) }

type multiHooks []Hooks

func (m multiHooks) Batch(ev BatchEvent) {
	for _, h := range m {
		h.Batch(ev)
	}
}

func (m multiHooks) CycleError(err error) {
	for _, h := range m {
		if ch, ok := h.(CycleErrorHooks); ok {
			ch.CycleError(err)
		}
	}
}

func (m multiHooks) UnworkedLanes(n int) {
	for _, h := range m {
		if lh, ok := h.(LaneHealthHooks); ok {
			lh.UnworkedLanes(n)
		}
	}
}

func (m multiHooks) RouteConfigs(n int) {
	for _, h := range m {
		if ch, ok := h.(ConfigHooks); ok {
			ch.RouteConfigs(n)
		}
	}
}

func (m multiHooks) Lanes(owned int) {
	for _, h := range m {
		h.Lanes(owned)
	}
}
