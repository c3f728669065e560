package relay

import (
	"sync"
	"time"
)

// A route's strain: what slows or fails its deliveries while its outage
// breaker lets them go. The route is rate limited while it waits for its
// rate limit (Config.RateLimit: a wait that had to wait) or for its
// destination, which asked it to slow down (a Retry-After: see
// breaker.pause); it is failing while its messages fail and count an
// attempt (retried or dead-lettered). Each lasts while it recurs within a
// heartbeat interval (Config.Heartbeat), so that the state each heartbeat
// records covers the interval before it. strain only observes: the
// limiter and the breaker decide, as before.

// Route health states (RouteState.Health), from the worst. A route in
// several states is in the worst of them.
const (
	RouteDestinationDown = "destination_down" // RouteState.Open
	RouteRateLimited     = "rate_limited"     // RouteState.Limited
	RouteDegraded        = "degraded"         // RouteState.Failing
	RouteDelivering      = "delivering"       // none of them
)

// Health is the route's state, the worst that holds: RouteDestinationDown,
// RouteRateLimited, RouteDegraded or RouteDelivering.
func (s RouteState) Health() string {
	switch {
	case s.Open:
		return RouteDestinationDown
	case s.Limited:
		return RouteRateLimited
	case s.Failing:
		return RouteDegraded
	}
	return RouteDelivering
}

// healthLevel numbers a RouteState.Health from the best (0) to the worst
// (3), for the test signal testsig.RouteState.
func healthLevel(health string) int {
	switch health {
	case RouteDegraded:
		return 1
	case RouteRateLimited:
		return 2
	case RouteDestinationDown:
		return 3
	}
	return 0
}

// strain records a route's waits and failures for RouteState. It is
// shared by the relay's workers.
type strain struct {
	window time.Duration // a heartbeat interval
	now    func() time.Time

	mu sync.Mutex
	// Limited since limitedSince (zero: not limited), for limitCause, the
	// latest wait ending at limitedUntil (later than now while a pause
	// lasts); waiting counts the waits for the limiter under way.
	limitedSince, limitedUntil time.Time
	limitCause                 error
	waiting                    int
	// Failing since failingSince (zero: not failing); failedAt and
	// deliveredAt are when the latest batch with a failure, and without,
	// settled; lastErr is the latest failure.
	failingSince, failedAt, deliveredAt time.Time
	lastErr                             error
}

func newStrain(window time.Duration) *strain {
	return &strain{window: window, now: time.Now}
}

// waitBegins records that a batch waits for the rate limit (cause says
// which); waitEnds, that it stopped waiting.
func (s *strain) waitBegins(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limitLocked(s.now(), cause)
	s.waiting++
}

func (s *strain) waitEnds() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting--
	s.limitedUntil = later(s.limitedUntil, s.now())
}

// paused records that the destination paused the route until then, for
// cause (the error that carried its Retry-After).
func (s *strain) paused(until time.Time, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limitLocked(s.now(), cause)
	s.limitedUntil = later(s.limitedUntil, until)
}

// limitLocked starts a limited streak at now unless one lasts.
func (s *strain) limitLocked(now time.Time, cause error) {
	if !s.limitedLocked(now) {
		s.limitedSince = now
	}
	s.limitCause = cause
}

// limitedLocked reports whether the route waited within the last window.
func (s *strain) limitedLocked(now time.Time) bool {
	return s.waiting > 0 || !s.limitedSince.IsZero() && now.Sub(s.limitedUntil) < s.window
}

// settled records a batch's settlement (committed): how many of its
// messages failed and counted an attempt, and the first failure.
func (s *strain) settled(failed int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if failed == 0 {
		s.deliveredAt = now
		return
	}
	if !s.failingLocked(now) {
		s.failingSince = now
	}
	s.failedAt, s.lastErr = now, err
}

// failingLocked reports whether the current failing streak lasts: it ends
// once a window passed since its latest failure and a batch delivered
// without a failure since (an idle route stays failing: its failed
// messages still wait, or are dead letters).
func (s *strain) failingLocked(now time.Time) bool {
	return !s.failingSince.IsZero() && !(s.deliveredAt.After(s.failedAt) && now.Sub(s.failedAt) >= s.window)
}

// fill sets st's Limited and Failing fields.
func (s *strain) fill(st *RouteState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.limitedLocked(now) {
		st.Limited, st.LimitedSince, st.LimitCause = true, s.limitedSince, s.limitCause
	} else {
		s.limitedSince, s.limitCause = time.Time{}, nil
	}
	if s.failingLocked(now) {
		st.Failing, st.FailingSince, st.LastError = true, s.failingSince, s.lastErr
	} else {
		s.failingSince, s.lastErr = time.Time{}, nil
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
