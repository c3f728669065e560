package relay

import (
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
)

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

// A claim that filled its batch is followed by one that starts after the
// last lane it took rows from, not one lane further: the lanes it found
// empty on the way are not walked again before every other lane has had
// its turn.
func TestNextRotation(t *testing.T) {
	t.Parallel()
	full := func(lanes ...int16) *flight {
		f := &flight{more: true}
		for _, l := range lanes {
			f.batch = append(f.batch, claim.Row{Lane: l})
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
		{"claim that visited every lane", 10, 2, &flight{batch: []claim.Row{{Lane: 40}}}, 12},
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
