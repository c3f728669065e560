// Package lanes holds the engine's vocabulary of lanes: a route's
// messages are spread over N lanes by key, each lane is leased to one
// relay at a time, and wake-ups name the lanes that got rows. It is
// plain data, shared by the leaser, the wake-up and the workers.
package lanes

import (
	"encoding/hex"
	"slices"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// N is how many lanes a route has.
const N = store.NumLanes

// Set is a set of the N lanes.
type Set [N / 64]uint64

// Add adds lane to s.
func (s *Set) Add(lane int) { s[lane>>6] |= 1 << (lane & 63) }

// Has reports whether lane is in s.
func (s Set) Has(lane int) bool { return s[lane>>6]&(1<<(lane&63)) != 0 }

// Empty reports whether s holds no lane.
func (s Set) Empty() bool { return s == Set{} }

// Union adds the lanes of o to s.
func (s *Set) Union(o Set) {
	for i := range s {
		s[i] |= o[i]
	}
}

// List returns the lanes of s in ascending order.
func (s Set) List() []int16 {
	out := make([]int16, 0, 8)
	for l := range N {
		if s.Has(l) {
			out = append(out, int16(l))
		}
	}
	return out
}

// Of returns the set of lanes listed (those out of range left out).
func Of(ls []int16) Set {
	var s Set
	for _, l := range ls {
		if l >= 0 && int(l) < N {
			s.Add(int(l))
		}
	}
	return s
}

// prefix starts a notification payload that names lanes.
const prefix = "lanes:"

// Payload renders s as a notification payload: "" when s is empty (a
// wake-up about every lane), else "lanes:" and the set in hex.
func (s Set) Payload() string {
	if s.Empty() {
		return ""
	}
	var b [N / 8]byte
	for l := range N {
		if s.Has(l) {
			b[l>>3] |= 1 << (l & 7)
		}
	}
	return prefix + hex.EncodeToString(b[:])
}

// Parse reads a payload that names lanes, written by Payload.
func Parse(p string) (Set, bool) {
	var s Set
	h, ok := strings.CutPrefix(p, prefix)
	if !ok {
		return s, false
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != N/8 {
		return s, false
	}
	for l := range N {
		if b[l>>3]&(1<<(l&7)) != 0 {
			s.Add(l)
		}
	}
	return s, true
}

// All are the numbers of every lane of a route, ascending. Read-only.
var All = func() []int16 {
	all := make([]int16, N)
	for i := range all {
		all[i] = int16(i)
	}
	return all
}()

// Without returns xs minus the elements of drop.
func Without(xs, drop []int16) []int16 {
	out := make([]int16, 0, len(xs))
	for _, x := range xs {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}
