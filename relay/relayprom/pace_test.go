package relayprom

import (
	"testing"
	"time"
)

// The backlog gauges refresh every interval from the start of the last
// count, unless that count took more than interval/countShare: then the
// next one starts countShare times its duration after it began.
func TestRefreshWait(t *testing.T) {
	for _, c := range []struct {
		interval, took, want time.Duration
	}{
		{15 * time.Second, 0, 15 * time.Second},
		{15 * time.Second, 100 * time.Millisecond, 14900 * time.Millisecond},
		{15 * time.Second, 750 * time.Millisecond, 14250 * time.Millisecond}, // exactly 1/20
		{15 * time.Second, time.Second, 19 * time.Second},                    // 20 s after it began
		{15 * time.Second, 8 * time.Second, 152 * time.Second},
		{20 * time.Millisecond, 5 * time.Millisecond, 95 * time.Millisecond},
	} {
		if got := refreshWait(c.interval, c.took); got != c.want {
			t.Errorf("refreshWait(%v, %v) = %v, want %v", c.interval, c.took, got, c.want)
		}
	}
}
