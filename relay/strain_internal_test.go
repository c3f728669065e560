package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A route is rate limited from its first wait until a heartbeat interval
// passes without one, a pause included; it is failing from its first
// failure until a heartbeat interval delivers without one.
func TestStrain(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	now := t0
	s := newStrain(time.Second)
	s.now = func() time.Time { return now }
	at := func(d time.Duration) RouteState {
		now = t0.Add(d)
		var st RouteState
		s.fill(&st)
		return st
	}
	limit := errors.New("rate limit 20/s (burst 20)")

	require.Equal(t, RouteDelivering, at(0).Health())
	s.waitBegins(limit)
	st := at(5 * time.Second)
	require.True(t, st.Limited, "a wait under way, however long")
	require.Equal(t, t0, st.LimitedSince)
	s.waitEnds()
	st = at(5900 * time.Millisecond)
	require.Equal(t, RouteRateLimited, st.Health())
	require.Equal(t, t0, st.LimitedSince, "within an interval of the wait's end")
	require.Equal(t, limit, st.LimitCause)
	require.False(t, at(6*time.Second).Limited, "an interval without a wait")

	retryAfter := errors.New("429: retry after 3s")
	now = t0.Add(10 * time.Second)
	s.paused(now.Add(3*time.Second), retryAfter)
	st = at(13500 * time.Millisecond)
	require.True(t, st.Limited, "paused, then an interval not over")
	require.Equal(t, t0.Add(10*time.Second), st.LimitedSince)
	require.Equal(t, retryAfter, st.LimitCause)
	require.False(t, at(14*time.Second).Limited)

	fail1, fail2 := errors.New("first"), errors.New("second")
	now = t0.Add(20 * time.Second)
	s.settled(1, fail1)
	now = t0.Add(21 * time.Second)
	s.settled(2, fail2)
	st = at(30 * time.Second)
	require.Equal(t, RouteDegraded, st.Health(), "no delivery since: still failing")
	require.Equal(t, t0.Add(20*time.Second), st.FailingSince)
	require.Equal(t, fail2, st.LastError)
	now = t0.Add(31 * time.Second)
	s.settled(1, fail1)
	now = t0.Add(31200 * time.Millisecond)
	s.settled(0, nil)
	require.True(t, at(31900*time.Millisecond).Failing, "delivered, but an interval has not passed")
	now = t0.Add(31950 * time.Millisecond)
	s.settled(1, fail1)
	require.True(t, at(32500*time.Millisecond).Failing, "failed again")
	now = t0.Add(32600 * time.Millisecond)
	s.settled(0, nil)
	require.True(t, at(32900*time.Millisecond).Failing)
	require.False(t, at(33*time.Second).Failing, "an interval delivered without failing")

	now = t0.Add(40 * time.Second)
	s.settled(1, fail2)
	st = at(40 * time.Second)
	require.Equal(t, t0.Add(40*time.Second), st.FailingSince, "a new streak")
	st.Open = true
	st.Limited = true
	require.Equal(t, RouteDestinationDown, st.Health())
	st.Open = false
	require.Equal(t, RouteRateLimited, st.Health())
}
