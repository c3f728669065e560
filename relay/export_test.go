package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// The package's tests (package relay_test) wait on the components' test
// signals (see signal.go): every relay New returns in a test binary
// records them.

func init() { signalsForTests = true }

// Signal is something a component of the relay announces to tests.
type Signal = testsig.Signal

// The signals, as package testsig describes them.
const (
	SigStarted      = testsig.Started
	SigStopped      = testsig.Stopped
	SigLeaseHeld    = testsig.LeaseHeld
	SigLeaseLost    = testsig.LeaseLost
	SigRebalanced   = testsig.Rebalanced
	SigBalanced     = testsig.Balanced
	SigMembersHeard = testsig.MembersHeard
	SigElected      = testsig.Elected
	SigFollowing    = testsig.Following
	SigWAL          = testsig.WAL
	SigPolling      = testsig.Polling
	SigWatcherIdle  = testsig.WatcherIdle
	SigWALMissed    = testsig.WALMissed
	SigFoundRows    = testsig.FoundRows
	SigSchemaHold   = testsig.SchemaHold
	SigChained      = testsig.Chained
	SigOutage       = testsig.Outage
	SigProbed       = testsig.Probed
	SigRouteState   = testsig.RouteState

	// The bits of SigMembersHeard's value.
	HeardFreed = testsig.HeardFreed
	HeardAsked = testsig.HeardAsked
)

// HealthLevel numbers a RouteState.Health as SigRouteState's value does.
func HealthLevel(health string) int { return healthLevel(health) }

// SignalCount returns how many times r announced sig so far: a mark for
// AwaitSignal.
func (r *Relay) SignalCount(sig Signal) int { return r.cfg.sig.Count(sig) }

// AwaitSignal waits up to d for an announcement of sig by r after the
// first after ones whose value satisfies match (any, when nil), and
// returns its value; the test fails when none comes.
func (r *Relay) AwaitSignal(t testing.TB, d time.Duration, sig Signal, after int, match func(int) bool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	v, err := r.cfg.sig.Await(ctx, sig, after, match)
	if err != nil {
		t.Fatalf("relay %s: no %q signal after the first %d within %s (%d so far)", r.cfg.ID, sig, after, d, r.cfg.sig.Count(sig))
	}
	return v
}

// AdvanceWatchClock moves the clock of r's wake-up (its watcher's looks,
// gaps, checks of the other listeners) ahead by d.
func (r *Relay) AdvanceWatchClock(d time.Duration) { r.cfg.sig.Advance(d) }

// ListenerConfig returns cfg with r's signals: a shared listener run with
// it announces its watcher's signals to r's observer.
func (r *Relay) ListenerConfig(cfg Config) Config {
	cfg.sig = r.cfg.sig
	return cfg
}

// What only a Set sets, for tests that wire relays by hand.

// Destination is one route a fan-out router copies messages to.
type Destination = fanOutDest

// WithFanOut makes cfg a fan-out router to dests.
func WithFanOut(cfg Config, dests ...Destination) Config { cfg.fanOut = dests; return cfg }

// WithDeliveries makes cfg take the fan-out copies made for its route.
func WithDeliveries(cfg Config) Config { cfg.deliveries = true; return cfg }

// WithSettleLinger makes a delivered batch's settlement wait up to d for
// the worker's next claim (see settleLinger).
func WithSettleLinger(cfg Config, d time.Duration) Config { cfg.linger = d; return cfg }

// WithSharedListener makes cfg rely on a ListenConfig run beside it.
func WithSharedListener(cfg Config) Config { cfg.sharedListener = true; return cfg }

// SharedListener and Deliveries report what a Set decided for cfg.
func SharedListener(cfg Config) bool { return cfg.sharedListener }
func Deliveries(cfg Config) bool     { return cfg.deliveries }

// FanOutOf returns the destinations of a fan-out router's cfg.
func FanOutOf(cfg Config) []Destination { return cfg.fanOut }

// ListenConfig runs the wake-up of cfg.Schema for relays configured
// WithSharedListener, calling wake when there may be new rows and members
// (unless nil) when relays came, went or handed lanes back, until ctx ends.
func ListenConfig(ctx context.Context, pool *pgxpool.Pool, cfg Config, wake, members func()) {
	var notified func(bool)
	if members != nil {
		notified = func(bool) { members() }
	}
	_, stop := listen(ctx, pool, cfg, func(lanes.Set) { wake() }, notified)
	<-ctx.Done()
	stop()
}

// RouterFeeds is routerFeeds.
var RouterFeeds = routerFeeds

// MembersChanged asks r's leaser for a heartbeat now (see
// lease.Leaser.MembersChanged).
func (r *Relay) MembersChanged() { r.lease.MembersChanged() }

// UnworkedLanes returns how many lanes of the route no live relay worked
// at the last heartbeat (see lease.Leaser.UnworkedLanes).
func (r *Relay) UnworkedLanes() int { return r.lease.UnworkedLanes() }

// Accessors only the tests need.

// ID returns the relay's id.
func (r *Relay) ID() string { return r.cfg.ID }

// ConfigSummary returns the summary of the route's configuration this
// relay registers (what status shows for it).
func (r *Relay) ConfigSummary() string { return r.lease.Summary() }

// RouteConfigs returns how many configurations the live relays of this
// relay's route ran at its last heartbeat; 0 before the first.
func (r *Relay) RouteConfigs() int { return r.lease.RouteConfigs() }

// Wake makes every worker look for work now (as a notification does).
func (r *Relay) Wake() {
	r.stats.Wakeups.Add(1)
	r.wakeAll()
}

// Degraded is what Readiness says is degraded while the Set is ready.
func (s *Set) Degraded(ctx context.Context) string {
	degraded, _ := s.Readiness(ctx)
	return degraded
}

// Conns returns the connections a Set of c holds when every worker is
// busy (see the function Conns); 0 when c is invalid.
func (c SetConfig) Conns() int {
	cfgs, err := c.Plan()
	if err != nil {
		return 0
	}
	return Conns(cfgs...)
}
