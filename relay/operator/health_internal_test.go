package operator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// A relay in several states reports the worst: down, then rate limited,
// then degraded; each state keeps its since and cause.
func TestRelayStatePrecedence(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	down := store.Relay{DownSince: t0, DownCause: "refused", DownProbes: 3}
	limited := store.Relay{LimitedSince: t0.Add(time.Second), LimitCause: "rate limit 20/s (burst 20)"}
	failing := store.Relay{FailingSince: t0.Add(2 * time.Second), LastError: "503 for key k"}
	all := store.Relay{DownSince: down.DownSince, DownCause: down.DownCause, DownProbes: 3,
		LimitedSince: limited.LimitedSince, LimitCause: limited.LimitCause, FailingSince: failing.FailingSince, LastError: failing.LastError}

	for _, c := range []struct {
		r            store.Relay
		state, cause string
		since        *time.Time
	}{
		{store.Relay{}, Delivering, "", nil},
		{failing, Degraded, "503 for key k", &failing.FailingSince},
		{limited, RateLimited, "rate limit 20/s (burst 20)", &limited.LimitedSince},
		{store.Relay{LimitedSince: limited.LimitedSince, LimitCause: "429", FailingSince: failing.FailingSince, LastError: "429"}, RateLimited, "429", &limited.LimitedSince},
		{all, DestinationDown, "refused", &down.DownSince},
	} {
		d := relayStatus(c.r).Delivery
		require.Equal(t, c.state, d.State)
		require.Equal(t, c.cause, d.Cause())
		require.Equal(t, c.since, d.Since())
	}
	d := relayStatus(all).Delivery
	require.Equal(t, "503 for key k", d.LastError, "the states a worse one hides are still reported")
	require.Equal(t, failing.FailingSince, *d.FailingSince)
}

// A route is in the worst state of its relays; for each state it takes the
// earliest since among its relays in it, with that relay's cause, and the
// most probes.
func TestRouteHealthMerge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	relays := []store.Relay{
		{ID: "a", Route: "orders", FailingSince: t0.Add(5 * time.Second), LastError: "late"},
		{ID: "b", Route: "orders", FailingSince: t0, LastError: "early"},
		{ID: "c", Route: "orders"},
		{ID: "d", Route: "billing", FailingSince: t0, LastError: "500"},
		{ID: "e", Route: "billing", LimitedSince: t0.Add(time.Minute), LimitCause: "rate limit 5/s (burst 5)"},
		{ID: "f", Route: "mail", DownSince: t0.Add(time.Second), DownCause: "second", DownProbes: 2},
		{ID: "g", Route: "mail", DownSince: t0, DownCause: "first", DownProbes: 1},
		{ID: "h", Route: "mail", LimitedSince: t0, LimitCause: "429"},
		{ID: "i", Route: "idle"},
	}
	rs := make([]RelayStatus, len(relays))
	for i, r := range relays {
		rs[i] = relayStatus(r)
	}
	got := routeHealth(rs)
	require.Len(t, got, 4)

	orders := got[0]
	require.Equal(t, "orders", orders.Route)
	require.Equal(t, Degraded, orders.State)
	require.Equal(t, 3, orders.Relays)
	require.Equal(t, 2, orders.RelaysFailing)
	require.Equal(t, t0, *orders.Since())
	require.Equal(t, "early", orders.Cause())

	billing := got[1]
	require.Equal(t, RateLimited, billing.State, "rate limited wins over degraded")
	require.Equal(t, 1, billing.RelaysLimited)
	require.Equal(t, 1, billing.RelaysFailing)
	require.Equal(t, "rate limit 5/s (burst 5)", billing.Cause())
	require.Equal(t, "500", billing.LastError)

	mail := got[2]
	require.Equal(t, DestinationDown, mail.State, "down wins over rate limited")
	require.Equal(t, 2, mail.RelaysDown)
	require.Equal(t, 1, mail.RelaysLimited)
	require.Equal(t, t0, *mail.DownSince)
	require.Equal(t, "first", mail.DownCause)
	require.Equal(t, 2, mail.DownProbes, "the most probes")

	idle := got[3]
	require.Equal(t, Delivering, idle.State)
	require.Nil(t, idle.Since())
	require.Empty(t, idle.Cause())
}

// Relays of one route that registered hashes of different encodings (an
// upgrade across a release that changed what the fingerprint covers) are
// not reported as running different configurations; relays whose hashes
// of one encoding differ are.
func TestMixedRoutesCompareHashesOfOneEncoding(t *testing.T) {
	t.Parallel()
	upgrade := []RelayStatus{{ID: "a", Route: "orders", ConfigHash: "1:aa"}, {ID: "b", Route: "orders", ConfigHash: "2:bb"}}
	require.Empty(t, mixedRoutes(upgrade))
	mixed := append(upgrade, RelayStatus{ID: "c", Route: "orders", ConfigHash: "2:cc", Config: "sink stdout"})
	got := mixedRoutes(mixed)
	require.Len(t, got, 1)
	require.Equal(t, "orders", got[0].Route)
	require.Len(t, got[0].Configs, 2)
	require.Equal(t, []string{"c"}, got[0].Configs[1].Relays)
}
