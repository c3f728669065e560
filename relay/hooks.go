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
	// Untouched, the messages held back behind their key.
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
	// Committed is false when settling failed: the batch comes again.
	Committed bool
	// AckedAt is when the sink accepted the batch on the database's
	// clock: AckedAt.Sub(m.CreatedAt) is free of clock skew.
	AckedAt time.Time
}

// Hooks observe a relay (metrics, tracing). Implementations must be fast
// and safe for concurrent use: they run on the relay's goroutines. Embed
// NopHooks to implement only some methods (and keep compiling when later
// versions add one).
type Hooks interface {
	// Batch reports a batch once it is settled (or failed to be).
	Batch(ev BatchEvent)
	// CycleError reports a cycle that failed before a batch could be
	// settled (the database unreachable, a connection lost).
	CycleError(err error)
	// Lanes reports how many lanes the relay owns, at each heartbeat
	// that changed them.
	Lanes(owned int)
	// UnworkedLanes reports, at every heartbeat, how many lanes of the
	// route no live relay has worked for longer than a lease TTL.
	UnworkedLanes(n int)
	// RouteConfigs reports, at every heartbeat, how many configurations
	// the live relays of the route run: 1 when they agree, more while
	// ConfigChangeAllow lets them differ.
	RouteConfigs(n int)
	// Outage reports that the route's destination went down as a whole
	// (open: its breaker opened, and the route claims nothing but a probe
	// of one message on a backoff; cause is the error that opened it) or
	// is back (cause nil).
	Outage(open bool, since time.Time, cause error)
	// RouteState reports, at every heartbeat, the route's state as the
	// heartbeat records it (see Relay.State).
	RouteState(st RouteState)
	// Wakeup reports how the process learns of new rows when that
	// changes: "wal" or "poll" while it is the schema's watcher, "follow"
	// while another process is, "notify"; fallback: the WAL could not be
	// followed, err says why.
	Wakeup(source string, fallback bool, err error)
}

// NopHooks ignores everything; embed it in hooks that observe only some
// events.
type NopHooks struct{}

func (NopHooks) Batch(BatchEvent)              {}
func (NopHooks) CycleError(error)              {}
func (NopHooks) Lanes(int)                     {}
func (NopHooks) UnworkedLanes(int)             {}
func (NopHooks) RouteConfigs(int)              {}
func (NopHooks) Outage(bool, time.Time, error) {}
func (NopHooks) RouteState(RouteState)         {}
func (NopHooks) Wakeup(string, bool, error)    {}

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
		h.CycleError(err)
	}
}

func (m multiHooks) Lanes(owned int) {
	for _, h := range m {
		h.Lanes(owned)
	}
}

func (m multiHooks) UnworkedLanes(n int) {
	for _, h := range m {
		h.UnworkedLanes(n)
	}
}

func (m multiHooks) RouteConfigs(n int) {
	for _, h := range m {
		h.RouteConfigs(n)
	}
}

func (m multiHooks) Outage(open bool, since time.Time, cause error) {
	for _, h := range m {
		h.Outage(open, since, cause)
	}
}

func (m multiHooks) RouteState(st RouteState) {
	for _, h := range m {
		h.RouteState(st)
	}
}

func (m multiHooks) Wakeup(source string, fallback bool, err error) {
	for _, h := range m {
		h.Wakeup(source, fallback, err)
	}
}
