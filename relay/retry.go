package relay

import (
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// A RetryPolicy decides, for a message whose delivery has just failed with
// an error the sink did not call permanent, whether it gets another
// attempt and when. The count of attempts lives in the message's row, so
// a policy keeps no state; every worker calls it, concurrently.
type RetryPolicy interface {
	// Retry is asked after the message's failures-th failed attempt (1
	// after the first) with the sink's error for it. It returns the wait
	// before the next attempt, or ok false to dead-letter the message with
	// the reason ReasonMaxAttempts.
	Retry(failures int, err error) (wait time.Duration, ok bool)
}

// ExponentialRetry is the default RetryPolicy: a message gets MaxAttempts
// attempts in all, the wait after the n-th failure being Initial ×
// Multiplier^(n-1), capped at Max and randomized by ± Jitter (a fraction;
// 0 or negative: none). A sink's Retry-After (sinks.RetryAfter) longer
// than that wait replaces it, up to Max.
type ExponentialRetry struct {
	Initial, Max time.Duration
	Multiplier   float64
	Jitter       float64
	MaxAttempts  int
}

// Retry implements RetryPolicy.
func (p ExponentialRetry) Retry(failures int, err error) (time.Duration, bool) {
	if failures >= p.MaxAttempts {
		return 0, false
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: max(p.Jitter, 0),
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	var d time.Duration
	for i := 0; i < failures && i < 64; i++ {
		d = b.NextBackOff()
	}
	if ra, ok := sinks.RetryAfter(err); ok && ra > d {
		d = min(ra, p.Max)
	}
	return d, true
}
