package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// The route states of package relay and of package operator are the same
// strings: the relay writes what the operator reads.
func TestRouteStateNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, operator.Delivering, relay.RouteDelivering)
	require.Equal(t, operator.Degraded, relay.RouteDegraded)
	require.Equal(t, operator.RateLimited, relay.RouteRateLimited)
	require.Equal(t, operator.DestinationDown, relay.RouteDestinationDown)
}

// statusOf returns a function that reads operator.Status of e's schema.
func statusOf(t *testing.T, e *env) func() operator.Status {
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	return func() operator.Status {
		t.Helper()
		st, err := admin.Status(context.Background())
		require.NoError(t, err)
		return st
	}
}

// awaitRelayState waits until the relays table says the one relay's route
// is in state, and returns the status that says so.
func awaitRelayState(t *testing.T, status func() operator.Status, state string) operator.Status {
	t.Helper()
	var st operator.Status
	testkit.Eventually(t, signalBound, 20*time.Millisecond, func() (bool, string) {
		st = status()
		return len(st.Relays) == 1 && st.Relays[0].State == state, fmt.Sprintf("relays %+v", st.Relays)
	})
	return st
}

// A route that waits for its rate limit is rate limited, and its
// heartbeat records it (since when, what limit) for the other processes;
// it stays ready. Once the backlog is drained and a heartbeat interval
// passed without a wait, it is delivering again.
func TestHeartbeatRecordsRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 60 {
		e.write(msg("t", fmt.Sprintf("k%d", i%5), fmt.Sprintf("m%d", i)))
	}
	cfg := e.config()
	cfg.Route = "orders"
	cfg.Topics = []string{"t"}
	cfg.RateLimit = 20
	r, _ := e.start(cfg, e.sink)
	status := statusOf(t, e)

	r.AwaitSignal(t, signalBound, relay.SigRouteState, 0, func(v int) bool { return v == relay.HealthLevel(relay.RouteRateLimited) })
	st := awaitRelayState(t, status, operator.RateLimited)
	limited := st.Relays[0]
	require.NotNil(t, limited.LimitedSince)
	require.False(t, limited.LimitedSince.After(st.Now), "bounded by the database's clock")
	require.Equal(t, "rate limit 20/s (burst 20)", limited.LimitCause)
	require.Equal(t, limited.LimitedSince, limited.Since())
	require.Nil(t, limited.DownSince)
	require.Equal(t, []operator.RouteHealth{{Route: "orders", Relays: 1, RelaysLimited: 1, Delivery: limited.Delivery}}, st.Routes)
	require.NoError(t, r.Ready(context.Background()), "a rate-limited route is ready")

	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), 60))
	st = awaitRelayState(t, status, operator.Delivering)
	require.Nil(t, st.Relays[0].LimitedSince)
	require.Empty(t, st.Relays[0].LimitCause)
	require.Equal(t, operator.Delivering, st.Routes[0].State)
}

// A destination that asks the route to slow down (a Retry-After for
// every message of a batch, across keys) makes it rate limited, with the
// error that asked as the cause.
func TestHeartbeatRecordsRetryAfter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	asked := map[string]bool{}
	e.sink.SetFail(func(m sinks.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if !asked[m.Key] {
			asked[m.Key] = true
			return &sinks.RetryAfterError{Err: errors.New("429 too many requests"), After: 2 * time.Second}
		}
		return nil
	})
	e.write(msg("t", "k1", "m"), msg("t", "k2", "m"))
	cfg := e.config()
	cfg.Workers = 1 // both messages in one batch
	r, _ := e.start(cfg, e.sink)
	status := statusOf(t, e)

	r.AwaitSignal(t, signalBound, relay.SigRouteState, 0, func(v int) bool { return v == relay.HealthLevel(relay.RouteRateLimited) })
	st := awaitRelayState(t, status, operator.RateLimited)
	require.Contains(t, st.Relays[0].LimitCause, "429 too many requests (retry after 2s)")
	require.NotNil(t, st.Relays[0].FailingSince, "the 429 counted an attempt too: rate limited wins")
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), 2))
	awaitRelayState(t, status, operator.Delivering)
}

// A route whose messages of one key fail (and count attempts) while the
// others deliver is degraded, and its heartbeat records since when and the
// last error; it stays ready. Once they stop failing and a heartbeat
// interval delivered without a failure, it is delivering again.
func TestHeartbeatRecordsFailingMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var failing atomic.Bool
	failing.Store(true)
	e.sink.SetFail(func(m sinks.Message) error {
		if m.Key == "bad" && failing.Load() {
			return errors.New("receiver answered 500 for\nkey bad")
		}
		return nil
	})
	cfg := e.config()
	cfg.MaxAttempts = 1000 // retried, never dead-lettered, while the test looks
	r, _ := e.start(cfg, e.sink)
	status := statusOf(t, e)
	e.write(msg("t", "bad", "b1"), msg("t", "good", "g1"), msg("t", "good", "g2"))

	r.AwaitSignal(t, signalBound, relay.SigRouteState, 0, func(v int) bool { return v == relay.HealthLevel(relay.RouteDegraded) })
	st := awaitRelayState(t, status, operator.Degraded)
	degraded := st.Relays[0]
	require.NotNil(t, degraded.FailingSince)
	require.False(t, degraded.FailingSince.After(st.Now), "bounded by the database's clock")
	require.Equal(t, "receiver answered 500 for key bad", degraded.LastError, "on one line")
	require.Equal(t, degraded.LastError, degraded.Cause())
	require.Nil(t, degraded.LimitedSince)
	require.Equal(t, 1, st.Routes[0].RelaysFailing)
	require.Equal(t, operator.Degraded, st.Routes[0].State)
	require.NoError(t, r.Ready(context.Background()), "a degraded route is ready")

	failing.Store(false)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), 3))
	st = awaitRelayState(t, status, operator.Delivering)
	require.Nil(t, st.Relays[0].FailingSince)
	require.Empty(t, st.Relays[0].LastError)
	var nulls bool
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT limited_since IS NULL AND limited_cause IS NULL AND failing_since IS NULL AND last_error IS NULL FROM "+e.table("relays")).Scan(&nulls))
	require.True(t, nulls, "a delivering route's relay row says nothing of limits or failures")
}
