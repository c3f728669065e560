package relay

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// retryDelay is the wait before the next attempt of a message that has now
// failed `failures` times. The state lives in the row (attempts); backoff
// only computes the delay, so it is rebuilt here for each message.
func (r *Relay) retryDelay(failures int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.cfg.RetryInitial,
		RandomizationFactor: max(r.cfg.RetryJitter, 0), // negative: disabled
		Multiplier:          r.cfg.RetryMultiplier,
		MaxInterval:         r.cfg.RetryMax,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	var d time.Duration
	for i := 0; i < failures && i < 64; i++ {
		d = b.NextBackOff()
	}
	return d
}

// newReconnectBackoff paces reconnects to the database and the sink after
// infrastructure errors (not message failures).
func newReconnectBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}
