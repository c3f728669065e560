package lanes

import (
	"slices"
	"testing"
)

func set(ls ...int) Set {
	var s Set
	for _, l := range ls {
		s.Add(l)
	}
	return s
}

func TestPayload(t *testing.T) {
	t.Parallel()
	s := set(0, 7, 63, 64, 200, 255)
	got, ok := Parse(s.Payload())
	if !ok || got != s {
		t.Fatalf("payload %q parsed as %v, %v; want %v", s.Payload(), got, ok, s)
	}
	if p := (Set{}).Payload(); p != "" {
		t.Fatalf("the empty set (every lane) is %q, want no payload", p)
	}
	for _, bad := range []string{"", "members", "lanes:zz", "lanes:00"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// A worker's pending wake-ups: a claim takes the lanes it may visit, the
// lanes of its batches in flight wait for them to end, and a wake-up
// about any lane makes the next claim visit every lane.
func TestPending(t *testing.T) {
	t.Parallel()
	var p Pending
	if p.Waiting(Set{}) {
		t.Fatal("a worker nothing woke has something waiting")
	}
	p.Add(set(2, 4))
	p.Add(set(130))
	busy := set(4)
	if !p.Waiting(busy) {
		t.Fatal("lanes 2 and 130 woken, not waiting")
	}
	got, all := p.Take(busy)
	if all || got != set(2, 130) || !slices.Equal(got.List(), []int16{2, 130}) {
		t.Fatalf("Take = %v %v, want lanes [2 130] (4 is in flight)", got.List(), all)
	}
	if p.Waiting(busy) {
		t.Fatal("only lane 4, in flight, should be left, and it waits for its batch")
	}
	if !p.Waiting(Set{}) {
		t.Fatal("lane 4 forgotten once its batch ended")
	}
	p.AddAll()
	got, all = p.Take(Set{})
	if !all || got != set(4) {
		t.Fatalf("Take = %v %v, want every lane and lane 4", got.List(), all)
	}
	if got, all = p.Take(Set{}); all || !got.Empty() {
		t.Fatalf("a second Take found %v %v", got.List(), all)
	}
}

// A claim visits the lanes the relay leases among the worker's (none:
// none), or, until a heartbeat has told it, every lane of the worker
// (nil).
func TestOwnedOf(t *testing.T) {
	t.Parallel()
	var o Owned
	if got := o.Of(1, 3); got != nil {
		t.Fatalf("no lanes known: %v, want nil", got)
	}
	o.Store([]int16{0, 1, 4, 7, 64, 130, 255, 300, -1}, false)
	for w, want := range [][]int16{{0, 255}, {1, 4, 7, 64, 130}, {}} {
		if got := o.Of(w, 3); got == nil || !slices.Equal(got, want) {
			t.Errorf("worker %d: %v, want %v", w, got, want)
		}
	}
	o.Store([]int16{2}, true)
	if got := o.Of(2, 3); !slices.Equal(got, []int16{2}) {
		t.Errorf("after adding lane 2: %v", got)
	}
	o.Drop([]int16{4, 130})
	if got := o.Of(1, 3); !slices.Equal(got, []int16{1, 7, 64}) {
		t.Errorf("after releasing lanes 4 and 130: %v", got)
	}
}

func TestWithout(t *testing.T) {
	t.Parallel()
	if got := Without([]int16{5, 1, 9, 3}, []int16{9, 5, 7}); !slices.Equal(got, []int16{1, 3}) {
		t.Fatalf("Without = %v, want [1 3]", got)
	}
	if len(All) != N || All[0] != 0 || All[N-1] != N-1 {
		t.Fatalf("All: %d lanes from %d to %d", len(All), All[0], All[len(All)-1])
	}
}
