package relay

import (
	"encoding/hex"
	"strings"
	"sync"
)

// Lane-targeted wake-ups. With every relay woken by every new row, each
// wake-up cost a claim transaction per worker of every process (measured:
// 27 database transactions per message at 50 msg/s with 16 relays). The
// watcher knows which lanes got rows (the lane column when it polls, the
// key in the WAL), says so in its NOTIFY ("lanes:" and the set in hex), and
// each process wakes only the workers that claim those lanes.

// laneSet is a set of the 256 lanes.
type laneSet [numLanes / 64]uint64

func (s *laneSet) add(lane int) { s[lane>>6] |= 1 << (lane & 63) }

func (s laneSet) has(lane int) bool { return s[lane>>6]&(1<<(lane&63)) != 0 }

func (s laneSet) empty() bool { return s == laneSet{} }

func (s *laneSet) union(o laneSet) {
	for i := range s {
		s[i] |= o[i]
	}
}

// lanesPrefix starts a notification payload that names lanes.
const lanesPrefix = "lanes:"

// payload renders s as a notification payload.
func (s laneSet) payload() string {
	var b [numLanes / 8]byte
	for l := range numLanes {
		if s.has(l) {
			b[l>>3] |= 1 << (l & 7)
		}
	}
	return lanesPrefix + hex.EncodeToString(b[:])
}

// parseLanes reads a payload written by payload.
func parseLanes(p string) (laneSet, bool) {
	var s laneSet
	h, ok := strings.CutPrefix(p, lanesPrefix)
	if !ok {
		return s, false
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != numLanes/8 {
		return s, false
	}
	for l := range numLanes {
		if b[l>>3]&(1<<(l&7)) != 0 {
			s.add(l)
		}
	}
	return s, true
}

// setOwned records the lanes this relay holds (adding to them with add).
// (Lanes it gains may hold a backlog no wake-up will name: the leaser
// wakes every worker, to visit all of its lanes, once the heartbeat that
// took them has committed.)
func (l *leaser) setOwned(lanes []int16, add bool) {
	s := laneSetOf(lanes)
	for i := range s {
		if add {
			l.ownedSet[i].Or(s[i])
		} else {
			l.ownedSet[i].Store(s[i])
		}
	}
	l.ownedKnown.Store(true)
}

// dropOwned forgets lanes this relay has released, so that claims stop
// visiting them before the next heartbeat.
func (l *leaser) dropOwned(lanes []int16) {
	s := laneSetOf(lanes)
	for i := range s {
		l.ownedSet[i].And(^s[i])
	}
}

// lanes returns the lanes this relay holds, as setOwned and dropOwned
// left them.
func (l *leaser) lanes() laneSet {
	var s laneSet
	for i := range s {
		s[i] = l.ownedSet[i].Load()
	}
	return s
}

// laneSetOf returns the set of lanes (those out of range left out).
func laneSetOf(lanes []int16) laneSet {
	var s laneSet
	for _, l := range lanes {
		if l >= 0 && int(l) < numLanes {
			s.add(int(l))
		}
	}
	return s
}

// ownedOf returns the lanes of worker this relay held at its last
// heartbeat, for a claim to visit; nil until a heartbeat has told (the
// claim then visits every lane of the worker, and its lease check skips
// those of other relays).
func (r *Relay) ownedOf(worker int) []int16 { return r.lease.ownedOf(worker) }

func (l *leaser) ownedOf(worker int) []int16 {
	if !l.ownedKnown.Load() {
		return nil
	}
	owned, out := l.lanes(), []int16{}
	for lane := worker; lane < numLanes; lane += l.workers {
		if owned.has(lane) {
			out = append(out, int16(lane))
		}
	}
	return out
}

// wakeLanes wakes the workers that claim any of lanes, naming those lanes
// to each (see pending); all of them while this relay does not know its
// lanes yet.
func (r *Relay) wakeLanes(lanes laneSet) {
	owned := r.lease.lanes()
	var mine laneSet
	for i := range mine {
		mine[i] = owned[i] & lanes[i]
	}
	if owned.empty() {
		r.wakeAll()
		return
	}
	n := r.cfg.Workers
	per := make([]laneSet, n)
	for l := range numLanes {
		if mine.has(l) {
			per[l%n].add(l)
		}
	}
	for w := range per {
		if per[w].empty() {
			continue
		}
		r.pend[w].add(per[w])
		select {
		case r.wake[w] <- struct{}{}:
		default:
		}
	}
}

// pending is what woke a worker since its claims last took it: some of
// its lanes, or any of them (all). A wake-up about new rows names their
// lanes (the watcher knows them), and the worker's next claim visits only
// those lanes; one about anything else (a notification without lanes, a
// rebalance that gave this relay lanes, a reconnection) makes the next
// claim visit every lane of the worker. A lane stays pending while a
// batch of the worker holds it: a claim beside the batch skips it, and
// the worker claims it again once the batch has ended.
type pending struct {
	mu    sync.Mutex
	lanes laneSet
	all   bool
}

func (p *pending) add(lanes laneSet) {
	p.mu.Lock()
	p.lanes.union(lanes)
	p.mu.Unlock()
}

func (p *pending) addAll() {
	p.mu.Lock()
	p.all = true
	p.mu.Unlock()
}

// take returns what woke the worker and forgets it, except the lanes in
// busy (its batches in flight), which stay pending.
func (p *pending) take(busy laneSet) (lanes laneSet, all bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	all, p.all = p.all, false
	for i := range p.lanes {
		lanes[i] = p.lanes[i] &^ busy[i]
		p.lanes[i] &= busy[i]
	}
	return lanes, all
}

// waiting reports whether a wake-up waits for a claim that can take it
// (about lanes not in busy, or about any lane).
func (p *pending) waiting(busy laneSet) bool {
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

// list returns the lanes of s in ascending order.
func (s laneSet) list() []int16 {
	out := make([]int16, 0, 8)
	for l := range numLanes {
		if s.has(l) {
			out = append(out, int16(l))
		}
	}
	return out
}
