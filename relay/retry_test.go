package relay

import (
	"errors"
	"testing"
	"time"
)

// TestNoJitterSurvivesDefaultsTwice: a disabled jitter (negative, what
// --retry-jitter=0 sets) stays disabled when defaults are applied twice, as
// a Set's plan and then New do. It used to become 0 the first time and the
// 0.2 default the second, so every route of a routes table jittered.
func TestNoJitterSurvivesDefaultsTwice(t *testing.T) {
	cfg := Config{RetryJitter: -1, RetryInitial: time.Second, RetryMultiplier: 2, RetryMax: time.Minute}
	p := cfg.WithDefaults().WithDefaults().retryPolicy()
	for range 50 {
		if d, _ := p.Retry(1, errors.New("refused")); d != time.Second {
			t.Fatalf("first retry delay %s with jitter disabled, want exactly 1s", d)
		}
		if d, _ := p.Retry(3, errors.New("refused")); d != 4*time.Second {
			t.Fatalf("third retry delay %s with jitter disabled, want exactly 4s", d)
		}
	}
	if got := (Config{}).WithDefaults().WithDefaults().RetryJitter; got != DefaultRetryJitter {
		t.Fatalf("unset jitter after defaults: %g, want the default %g", got, DefaultRetryJitter)
	}
}
