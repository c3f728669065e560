package relay

import (
	"slices"
	"testing"
	"time"
)

func TestLaneSetPayload(t *testing.T) {
	t.Parallel()
	var s laneSet
	for _, l := range []int{0, 7, 63, 64, 200, 255} {
		s.add(l)
	}
	got, ok := parseLanes(s.payload())
	if !ok || got != s {
		t.Fatalf("payload %q parsed as %v, %v; want %v", s.payload(), got, ok, s)
	}
	for _, bad := range []string{"", "members", "lanes:zz", "lanes:00"} {
		if _, ok := parseLanes(bad); ok {
			t.Errorf("parseLanes(%q) accepted", bad)
		}
	}
}

// The polling watcher's gaps: ids missing below the newest it saw, looked
// for again until found, expired, or pushed out by newer ones.
func TestGapList(t *testing.T) {
	now := time.Now()
	var g gapList
	g.add(10, []int64{11, 14, 15, 17}, now)
	if got := g.ids(now); !slices.Equal(got, []int64{12, 13, 16}) {
		t.Fatalf("gaps after 10 → 11,14,15,17: %v, want 12 13 16", got)
	}
	g.fill([]int64{13})
	if got := g.ids(now); !slices.Equal(got, []int64{12, 16}) {
		t.Fatalf("after 13 was found: %v, want 12 16", got)
	}
	if got := g.ids(now.Add(gapTTL)); len(got) != 0 {
		t.Fatalf("gaps outlived gapTTL: %v", got)
	}
	g = nil
	g.add(0, []int64{1000}, now) // a jump: only the newest maxGaps below it
	got := g.ids(now)
	if len(got) != maxGaps || got[0] != 1000-maxGaps || got[len(got)-1] != 999 {
		t.Fatalf("after a jump to 1000: %d gaps from %d to %d, want %d from %d to 999", len(got), got[0], got[len(got)-1], maxGaps, 1000-maxGaps)
	}
	g.add(1000, []int64{1002}, now) // newer gaps push out the oldest
	got = g.ids(now)
	if len(got) != maxGaps || got[len(got)-1] != 1001 || slices.Contains(got, 1000-maxGaps) {
		t.Fatalf("the newest gap 1001 kept and the oldest dropped: %v", got)
	}
}

// A worker's pending wake-ups: a claim takes the lanes it may visit, the
// lanes of its batches in flight wait for them to end, and a wake-up
// about any lane makes the next claim visit every lane.
func TestPending(t *testing.T) {
	t.Parallel()
	set := func(ls ...int) laneSet {
		var s laneSet
		for _, l := range ls {
			s.add(l)
		}
		return s
	}
	var p pending
	if p.waiting(laneSet{}) {
		t.Fatal("a worker nothing woke has something waiting")
	}
	p.add(set(2, 4))
	p.add(set(130))
	busy := set(4)
	if !p.waiting(busy) {
		t.Fatal("lanes 2 and 130 woken, not waiting")
	}
	got, all := p.take(busy)
	if all || got != set(2, 130) || !slices.Equal(got.list(), []int16{2, 130}) {
		t.Fatalf("take = %v %v, want lanes [2 130] (4 is in flight)", got.list(), all)
	}
	if p.waiting(busy) {
		t.Fatal("only lane 4, in flight, should be left, and it waits for its batch")
	}
	if !p.waiting(laneSet{}) {
		t.Fatal("lane 4 forgotten once its batch ended")
	}
	p.addAll()
	got, all = p.take(laneSet{})
	if !all || got != set(4) {
		t.Fatalf("take = %v %v, want every lane and lane 4", got.list(), all)
	}
	if got, all = p.take(laneSet{}); all || !got.empty() {
		t.Fatalf("a second take found %v %v", got.list(), all)
	}
}

// A claim that filled its batch is followed by one that starts after the
// last lane it took rows from, not one lane further: the lanes it found
// empty on the way are not walked again before every other lane has had
// its turn.
func TestNextRotation(t *testing.T) {
	t.Parallel()
	full := func(lanes ...int16) *flight {
		f := &flight{more: true}
		for _, l := range lanes {
			f.batch = append(f.batch, claimed{lane: l})
		}
		return f
	}
	for _, c := range []struct {
		name              string
		rotation, workers int
		f                 *flight
		want              int
	}{
		{"empty claim", 10, 2, nil, 12},
		{"claim that visited every lane", 10, 2, &flight{batch: []claimed{{lane: 40}}}, 12},
		{"full claim", 10, 2, full(10, 10, 24, 40), 42},
		{"full claim from the first lane only", 10, 2, full(10, 10), 12},
		{"wraps around", 250, 2, full(250, 254), 0},
		{"one worker", 7, 1, full(7, 8, 30), 31},
		{"four workers", 3, 4, full(3, 255), 3},
	} {
		if got := nextRotation(c.rotation, c.workers, c.f); got != c.want {
			t.Errorf("%s: nextRotation(%d, %d) = %d, want %d", c.name, c.rotation, c.workers, got, c.want)
		}
	}
}

// A claim visits the lanes the relay leases among the worker's (none:
// none), or, until a heartbeat has told it, every lane of the worker
// (nil).
func TestOwnedOf(t *testing.T) {
	r := newLeaser(leaserConfig{workers: 3})
	if got := r.ownedOf(1); got != nil {
		t.Fatalf("no lanes known: %v, want nil", got)
	}
	r.setOwned([]int16{0, 1, 4, 7, 64, 130, 255}, false)
	for w, want := range [][]int16{{0, 255}, {1, 4, 7, 64, 130}, {}} {
		if got := r.ownedOf(w); got == nil || !slices.Equal(got, want) {
			t.Errorf("worker %d: %v, want %v", w, got, want)
		}
	}
	r.setOwned([]int16{2}, true)
	if got := r.ownedOf(2); !slices.Equal(got, []int16{2}) {
		t.Errorf("after adding lane 2: %v", got)
	}
	r.dropOwned([]int16{4, 130})
	if got := r.ownedOf(1); !slices.Equal(got, []int16{1, 7, 64}) {
		t.Errorf("after releasing lanes 4 and 130: %v", got)
	}
}
