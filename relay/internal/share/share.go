// Package share divides the batches a process's sources (relay.Sources)
// have under way among them: while several sources have work, each may
// have its share of the process's batches under way, weighted, at least
// one; a source alone is not held back. A source with a backlog then
// takes its share of its database, the sink and the process's cores, not
// all of them.
//
// A member is active while it has a batch under way, or waits to, and
// for ActiveFor after its last one that was not empty ended: a source that delivers 100
// messages a second, one batch every 10 ms, stays active between its
// batches. The Gate counts what its members tell it (Acquire, Release):
// what a batch is, and when it ends, is the relay's.
package share

import (
	"context"
	"sync"
	"time"
)

// ActiveFor is how long a member counts as active after its last batch
// ended.
const ActiveFor = 100 * time.Millisecond

// Gate is the batches of one process, shared by its Members. The zero Gate
// is not usable: see New.
type Gate struct {
	batches int
	now     func() time.Time

	mu      sync.Mutex
	members map[*Member]struct{}
	// freed is closed, and replaced, when a batch ends or a member leaves:
	// the waiters look again.
	freed chan struct{}
}

// New returns a Gate of n batches (at least 1) to share while several
// members are active.
func New(n int) *Gate {
	return &Gate{batches: max(1, n), now: time.Now, members: map[*Member]struct{}{}, freed: make(chan struct{})}
}

// Member is one source's part of a Gate.
type Member struct {
	g      *Gate
	weight int
	// Under the Gate's mu: batches under way, waiters, when the last
	// batch ended, and how long its Acquires waited, in all.
	under, waiting int
	lastEnd        time.Time
	waited         time.Duration
}

// Join adds a member of weight weight (at least 1).
func (g *Gate) Join(weight int) *Member {
	m := &Member{g: g, weight: max(1, weight)}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members[m] = struct{}{}
	return m
}

// Leave removes m; batches it has under way end as usual.
func (m *Member) Leave() {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members, m)
	g.wakeLocked()
}

// Acquire waits until m may start a batch, or ctx ends (its error; with
// a context that has ended it returns nil only if it need not wait). Each
// Acquire that returns nil is followed by one Release.
func (m *Member) Acquire(ctx context.Context) error {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	m.waiting++
	defer func() { m.waiting-- }()
	var since time.Time
	for !m.mayLocked(g.now()) {
		if since.IsZero() {
			since = g.now()
		}
		freed := g.freed
		g.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-freed:
		}
		g.mu.Lock()
		m.waited += g.now().Sub(since)
		since = g.now()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	m.under++
	return nil
}

// Waited is how long m's Acquires have waited for its share, in all.
func (m *Member) Waited() time.Duration {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.waited
}

// Release ends a batch that Acquire let start; empty: it found nothing
// to do (an empty claim), which does not keep m active.
func (m *Member) Release(empty bool) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	m.under--
	if !empty {
		m.lastEnd = g.now()
	}
	g.wakeLocked()
}

// Share is how many batches m may have under way now: all it wants while
// no other member is active, else its weighted part of the Gate's, at
// least one.
func (m *Member) Share() int {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.shareLocked(m.g.now())
}

func (m *Member) mayLocked(now time.Time) bool {
	return m.under < m.shareLocked(now)
}

func (m *Member) shareLocked(now time.Time) int {
	g := m.g
	total, others := m.weight, false
	for o := range g.members {
		if o != m && o.activeLocked(now) {
			total += o.weight
			others = true
		}
	}
	if !others {
		return int(^uint(0) >> 1)
	}
	return max(1, g.batches*m.weight/total)
}

// activeLocked reports whether m has a batch under way, waits to, or
// ended one within ActiveFor.
func (m *Member) activeLocked(now time.Time) bool {
	return m.under > 0 || m.waiting > 0 || (!m.lastEnd.IsZero() && now.Sub(m.lastEnd) < ActiveFor)
}

// wakeLocked lets the waiters look again.
func (g *Gate) wakeLocked() {
	close(g.freed)
	g.freed = make(chan struct{})
}
