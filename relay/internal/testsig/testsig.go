// Package testsig carries the engine's test signals. The relay's
// components announce what they did (a lease renewed, lanes balanced, a
// watcher elected or idle) on a Bus that only tests install: tests wait
// for an announcement instead of sleeping for long enough. In a
// production relay the Bus is nil, and announcing costs a nil check.
package testsig

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Signal is something a component announces.
type Signal uint8

const (
	// The relay (value 0).
	Started Signal = iota + 1 // Run started its components
	Stopped                   // Run handed its lanes back and returns

	// The leaser (value: the lanes this relay owns, unless said).
	LeaseHeld    // a heartbeat renewed the lease
	LeaseLost    // a heartbeat failed (value 0)
	Rebalanced   // a heartbeat changed the lanes this relay owns
	Balanced     // a heartbeat left this relay at its fair share, handing nothing over
	MembersHeard // a membership notification came in; value: HeardFreed, HeardAsked

	// The wake-up (value 0).
	Elected     // this session became the schema's watcher
	Following   // another session holds the watcher's lock
	WAL         // the watcher follows the WAL
	Polling     // the watcher polls for new rows
	WatcherIdle // the watcher has woken nobody for a while
	WALMissed   // claims did not return rows woken from the WAL stream in time (value: how many)
	FoundRows   // a look for new rows found some
	CaughtUp    // the looks found what the WAL stream reported; the watcher stops looking until the next report

	// A worker (value: its id).
	SchemaHold // the worker stopped claiming: the schema needs a newer relay
	Chained    // a claim deleted the rows of the worker's batch before it, in that batch's transaction

	// The outage breaker.
	Outage // it opened (value 1) or closed (value 0)
	Probed // a probe found the destination still down (value: how many so far)

	// The leaser.
	RouteState // a heartbeat recorded the route's state (value: its health level, 0 best to 3 worst)

	numSignals
)

var names = [numSignals]string{"", "started", "stopped", "lease held", "lease lost", "rebalanced", "balanced", "members heard",
	"elected", "following", "WAL", "polling", "watcher idle", "WAL missed", "found rows", "caught up", "schema hold", "chained", "outage", "probed", "route state"}

func (s Signal) String() string {
	if s < numSignals {
		return names[s]
	}
	return "signal " + strconv.Itoa(int(s))
}

// The bits of MembersHeard's value.
const (
	HeardFreed = 1 << iota // the notification said lanes were handed back
	HeardAsked             // the relay asked for a heartbeat
)

// Bus records the announcements, for tests to wait on. A nil *Bus
// records nothing.
type Bus struct {
	mu      sync.Mutex
	values  [numSignals][]int // each announcement's value, in order
	changed chan struct{}     // closed (and replaced) at each announcement
	// skew moves the wake-up's clock ahead (see Now), for tests whose
	// subject is a span of the watcher's time.
	skew atomic.Int64
}

// New returns a Bus.
func New() *Bus { return &Bus{changed: make(chan struct{})} }

// Emit announces sig with a value.
func (b *Bus) Emit(sig Signal, v int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.values[sig] = append(b.values[sig], v)
	close(b.changed)
	b.changed = make(chan struct{})
}

// Count returns how many times sig was announced.
func (b *Bus) Count(sig Signal) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.values[sig])
}

// Await waits for an announcement of sig after the first after ones
// whose value satisfies match (any, when nil), and returns its value.
func (b *Bus) Await(ctx context.Context, sig Signal, after int, match func(int) bool) (int, error) {
	for {
		b.mu.Lock()
		vs, changed := b.values[sig], b.changed
		b.mu.Unlock()
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

// Now is the wake-up's clock: the time, moved ahead by what a test
// advanced it.
func (b *Bus) Now() time.Time {
	if b == nil {
		return time.Now()
	}
	return time.Now().Add(time.Duration(b.skew.Load()))
}

// Advance moves the clock Now reads ahead by d.
func (b *Bus) Advance(d time.Duration) { b.skew.Add(int64(d)) }
