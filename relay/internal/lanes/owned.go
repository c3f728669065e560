package lanes

import (
	"sync"
	"sync/atomic"
)

// Owned is the set of lanes a relay holds, written by its leaser and read
// by its workers and its wake-up, concurrently.
type Owned struct {
	bits  [N / 64]atomic.Uint64
	known atomic.Bool
}

// Store records the lanes held (adding to them with add).
func (o *Owned) Store(ls []int16, add bool) {
	s := Of(ls)
	for i := range s {
		if add {
			o.bits[i].Or(s[i])
		} else {
			o.bits[i].Store(s[i])
		}
	}
	o.known.Store(true)
}

// Drop forgets lanes given up.
func (o *Owned) Drop(ls []int16) {
	s := Of(ls)
	for i := range s {
		o.bits[i].And(^s[i])
	}
}

// Known reports whether Store was called.
func (o *Owned) Known() bool { return o.known.Load() }

// Load returns the lanes held.
func (o *Owned) Load() Set {
	var s Set
	for i := range s {
		s[i] = o.bits[i].Load()
	}
	return s
}

// Of returns the lanes held that worker (of workers) claims; nil until
// Store was called.
func (o *Owned) Of(worker, workers int) []int16 {
	if !o.Known() {
		return nil
	}
	held, out := o.Load(), []int16{}
	for lane := worker; lane < N; lane += workers {
		if held.Has(lane) {
			out = append(out, int16(lane))
		}
	}
	return out
}

// Pending is what woke a worker since its claims last took it: some of
// its lanes, or any of them (all). A wake-up about new rows names their
// lanes (the watcher knows them), and the worker's next claim visits only
// those lanes; one about anything else (a notification without lanes, a
// rebalance that gave the relay lanes, a reconnection) makes the next
// claim visit every lane of the worker. A lane stays pending while a
// batch of the worker holds it: a claim beside the batch skips it, and
// the worker claims it again once the batch has ended.
type Pending struct {
	mu    sync.Mutex
	lanes Set
	all   bool
}

// Add records a wake-up about lanes.
func (p *Pending) Add(lanes Set) {
	p.mu.Lock()
	p.lanes.Union(lanes)
	p.mu.Unlock()
}

// AddAll records a wake-up about every lane.
func (p *Pending) AddAll() {
	p.mu.Lock()
	p.all = true
	p.mu.Unlock()
}

// Take returns what woke the worker and forgets it, except the lanes in
// busy (its batches in flight), which stay pending.
func (p *Pending) Take(busy Set) (lanes Set, all bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	all, p.all = p.all, false
	for i := range p.lanes {
		lanes[i] = p.lanes[i] &^ busy[i]
		p.lanes[i] &= busy[i]
	}
	return lanes, all
}

// Waiting reports whether a wake-up waits for a claim that can take it
// (about lanes not in busy, or about any lane).
func (p *Pending) Waiting(busy Set) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.all {
		return true
	}
	for i := range p.lanes {
		if p.lanes[i]&^busy[i] != 0 {
			return true
		}
	}
	return false
}
