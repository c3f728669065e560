package sinkconf

import (
	"fmt"
	"time"
)

// NamedDuration is a duration field of a sink's configuration under the
// name its users write (the URL parameter and YAML key), for
// CheckDurations. Build it with Dur.
type NamedDuration struct {
	name string
	v    time.Duration
	max  time.Duration // 0: no upper bound
}

// Dur names the value v of a configuration field.
func Dur(name string, v time.Duration) NamedDuration { return NamedDuration{name: name, v: v} }

// AtMost bounds d: CheckDurations refuses a value above max.
func (d NamedDuration) AtMost(bound time.Duration) NamedDuration {
	d.max = bound
	return d
}

// CheckDurations reports the first of ds that is negative or above its
// bound, naming it ("outbox: amqp: dial_timeout: must not be negative,
// got -1s"). Zero passes: it selects the field's default.
func CheckDurations(sink string, ds ...NamedDuration) error {
	for _, d := range ds {
		if d.v < 0 {
			return fmt.Errorf("outbox: %s: %s: must not be negative, got %s", sink, d.name, d.v)
		}
		if d.max > 0 && d.v > d.max {
			return fmt.Errorf("outbox: %s: %s: at most %s, got %s", sink, d.name, d.max, d.v)
		}
	}
	return nil
}

// ReconnectDefaults returns the reconnection backoff of a sink that keeps
// a connection to its broker (reconnect_initial, doubled with jitter up to
// reconnect_max) with the defaults applied: a zero initial becomes
// defInitial, a zero largest becomes defLargest, or initial when that is
// larger.
func ReconnectDefaults(initial, largest, defInitial, defLargest time.Duration) (time.Duration, time.Duration) {
	if initial == 0 {
		initial = defInitial
	}
	if largest == 0 {
		largest = max(defLargest, initial)
	}
	return initial, largest
}

// CheckReconnect reports, naming both fields, a reconnect_max (largest)
// that is set and less than reconnect_initial.
func CheckReconnect(sink string, initial, largest time.Duration) error {
	if largest != 0 && largest < initial {
		return fmt.Errorf("outbox: %s: reconnect_max: %s is less than reconnect_initial %s", sink, largest, initial)
	}
	return nil
}
