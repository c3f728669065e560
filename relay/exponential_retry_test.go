package relay_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
)

var errRefused = errors.New("connection refused")

// TestExponentialRetry: the default policy's waits grow and cap, a
// sink's Retry-After lengthens (never shortens) a wait up to the cap, and
// the policy gives up at MaxAttempts.
func TestExponentialRetry(t *testing.T) {
	p := relay.ExponentialRetry{Initial: time.Second, Max: time.Minute, Multiplier: 2, Jitter: -1, MaxAttempts: 5}
	for _, tc := range []struct {
		failures int
		err      error
		want     time.Duration
		ok       bool
	}{
		{1, errRefused, time.Second, true},
		{2, errRefused, 2 * time.Second, true},
		{4, errRefused, 8 * time.Second, true},
		{1, &sinks.RetryAfterError{Err: errRefused, After: 30 * time.Second}, 30 * time.Second, true},
		{4, &sinks.RetryAfterError{Err: errRefused, After: time.Second}, 8 * time.Second, true},
		{1, &sinks.RetryAfterError{Err: errRefused, After: time.Hour}, time.Minute, true},
		{5, errRefused, 0, false},
	} {
		got, ok := p.Retry(tc.failures, tc.err)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Retry(%d, %v) = %s, %v; want %s, %v", tc.failures, tc.err, got, ok, tc.want, tc.ok)
		}
	}
	big := relay.ExponentialRetry{Initial: time.Second, Max: time.Minute, Multiplier: 2, Jitter: -1, MaxAttempts: 100}
	if d, _ := big.Retry(40, errRefused); d != time.Minute {
		t.Errorf("40th failure waits %s, want the cap 1m", d)
	}
}
