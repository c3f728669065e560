package relay

import (
	"crypto/md5"
	"encoding/hex"
	"strings"
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

// laneOf is the lane of a message, as the messages table computes it
// (migrations/001: the first byte of the key's md5; id mod 256 without a
// key). TestLaneOfMatchesTheTable keeps the two in step.
func laneOf(key *string, id int64) int {
	if key == nil {
		return int(id % numLanes)
	}
	sum := md5.Sum([]byte(*key))
	return int(sum[0])
}

// setOwned records the lanes this relay holds (adding to them with add).
func (r *Relay) setOwned(lanes []int16, add bool) {
	var s laneSet
	for _, l := range lanes {
		if l >= 0 && int(l) < numLanes {
			s.add(int(l))
		}
	}
	for i := range s {
		if add {
			r.ownedSet[i].Or(s[i])
		} else {
			r.ownedSet[i].Store(s[i])
		}
	}
}

// wakeLanes wakes the workers that claim any of lanes; all of them while
// this relay does not know its lanes yet.
func (r *Relay) wakeLanes(lanes laneSet) {
	var mine laneSet
	known := false
	for i := range mine {
		o := r.ownedSet[i].Load()
		known = known || o != 0
		mine[i] = o & lanes[i]
	}
	if !known {
		r.wakeAll()
		return
	}
	for l := range numLanes {
		if mine.has(l) {
			select {
			case r.wake[l%r.cfg.Workers] <- struct{}{}:
			default:
			}
		}
	}
}
