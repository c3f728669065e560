package relay

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
)

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
