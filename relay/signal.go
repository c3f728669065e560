package relay

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Test signals. The relay's components announce what they did (a lease
// renewed, lanes balanced, a watcher elected or idle) to a signals
// observer that only the package's tests install (see export_test.go):
// tests wait for an announcement instead of sleeping for long enough. In
// a production relay the observer is nil, and announcing costs a nil
// check.

// signal is something a component announces.
type signal uint8

const (
	// The relay (value 0).
	sigStarted signal = iota + 1 // Run started its components
	sigStopped                   // Run handed its lanes back and returns

	// The leaser (value: the lanes this relay owns, unless said).
	sigLeaseHeld    // a heartbeat renewed the lease
	sigLeaseLost    // a heartbeat failed (value 0)
	sigRebalanced   // a heartbeat changed the lanes this relay owns
	sigBalanced     // a heartbeat left this relay at its fair share, handing nothing over
	sigMembersHeard // a membership notification came in; value: heardFreed, heardAsked

	// The waker (value 0).
	sigElected     // this session became the schema's watcher
	sigFollowing   // another session holds the watcher's lock
	sigWAL         // the watcher follows the WAL
	sigPolling     // the watcher polls for new rows
	sigWatcherIdle // the watcher has woken nobody for a while (see watch.idle)

	// A worker (value: its id).
	sigSchemaHold // the worker stopped claiming: the schema needs a newer relay

	// The outage breaker.
	sigOutage // it opened (value 1) or closed (value 0)
	sigProbed // a probe found the destination still down (value: how many so far)

	// The leaser.
	sigRouteState // a heartbeat recorded the route's state (value: healthLevel)

	numSignals
)

var signalNames = [numSignals]string{"", "started", "stopped", "lease held", "lease lost", "rebalanced", "balanced", "members heard",
	"elected", "following", "WAL", "polling", "watcher idle", "schema hold", "outage", "probed", "route state"}

func (s signal) String() string {
	if s < numSignals {
		return signalNames[s]
	}
	return "signal " + strconv.Itoa(int(s))
}

// The bits of sigMembersHeard's value.
const (
	heardFreed = 1 << iota // the notification said lanes were handed back
	heardAsked             // the relay asked for a heartbeat
)

// signals records the announcements, for tests to wait on. A nil
// *signals records nothing.
type signals struct {
	mu      sync.Mutex
	values  [numSignals][]int // each announcement's value, in order
	changed chan struct{}     // closed (and replaced) at each announcement
	// skew moves the waker's clock ahead (see now), for tests whose
	// subject is a span of the watcher's time.
	skew atomic.Int64
}

func newSignals() *signals { return &signals{changed: make(chan struct{})} }

// signalsForTests makes New give every relay a signals observer; only the
// package's tests set it.
var signalsForTests bool

// emit announces sig with a value.
func (s *signals) emit(sig signal, v int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values[sig] = append(s.values[sig], v)
	close(s.changed)
	s.changed = make(chan struct{})
}

// count returns how many times sig was announced.
func (s *signals) count(sig signal) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.values[sig])
}

// await waits for an announcement of sig after the first after ones
// whose value satisfies match (any, when nil), and returns its value.
func (s *signals) await(ctx context.Context, sig signal, after int, match func(int) bool) (int, error) {
	for {
		s.mu.Lock()
		vs, changed := s.values[sig], s.changed
		s.mu.Unlock()
		for i := after; i < len(vs); i++ {
			if match == nil || match(vs[i]) {
				return vs[i], nil
			}
		}
		after = max(after, len(vs))
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-changed:
		}
	}
}

// now is the waker's clock: the time, moved ahead by what a test
// advanced it.
func (s *signals) now() time.Time {
	if s == nil {
		return time.Now()
	}
	return time.Now().Add(time.Duration(s.skew.Load()))
}
