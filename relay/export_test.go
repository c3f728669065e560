package relay

import (
	"context"
	"testing"
	"time"
)

// The package's tests (package relay_test) wait on the components' test
// signals (see signal.go): every relay New returns in a test binary
// records them.

func init() { signalsForTests = true }

// Signal is something a component of the relay announces to tests.
type Signal = signal

// The signals, as signal.go describes them.
const (
	SigStarted      = sigStarted
	SigStopped      = sigStopped
	SigLeaseHeld    = sigLeaseHeld
	SigLeaseLost    = sigLeaseLost
	SigRebalanced   = sigRebalanced
	SigBalanced     = sigBalanced
	SigMembersHeard = sigMembersHeard
	SigElected      = sigElected
	SigFollowing    = sigFollowing
	SigWAL          = sigWAL
	SigPolling      = sigPolling
	SigWatcherIdle  = sigWatcherIdle

	// The bits of SigMembersHeard's value.
	HeardFreed = heardFreed
	HeardAsked = heardAsked
)

// SignalCount returns how many times r announced sig so far: a mark for
// AwaitSignal.
func (r *Relay) SignalCount(sig Signal) int { return r.cfg.sig.count(sig) }

// AwaitSignal waits up to d for an announcement of sig by r after the
// first after ones whose value satisfies match (any, when nil), and
// returns its value; the test fails when none comes.
func (r *Relay) AwaitSignal(t testing.TB, d time.Duration, sig Signal, after int, match func(int) bool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	v, err := r.cfg.sig.await(ctx, sig, after, match)
	if err != nil {
		t.Fatalf("relay %s: no %q signal after the first %d within %s (%d so far)", r.cfg.ID, sig, after, d, r.cfg.sig.count(sig))
	}
	return v
}

// AdvanceWatchClock moves the clock of r's wake-up (its watcher's looks,
// gaps, checks of the other listeners) ahead by d.
func (r *Relay) AdvanceWatchClock(d time.Duration) { r.cfg.sig.skew.Add(int64(d)) }

// ListenerConfig returns cfg with r's signals: a shared listener run with
// it announces its watcher's signals to r's observer.
func (r *Relay) ListenerConfig(cfg Config) Config {
	cfg.sig = r.cfg.sig
	return cfg
}
