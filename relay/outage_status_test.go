package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
)

// A relay's heartbeat records its route's outage for the other processes:
// while its webhook refuses connections, the relays table (and so
// operator.Status, which `outbox-relay status` and the console show) says
// the destination is down, since when, after how many probes and why; once
// a probe gets through it says the route delivers again.
func TestHeartbeatRecordsOutage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := testkit.NewTestReceiver(t, func(*testkit.Request) (int, string) { return http.StatusNoContent, "" })
	sink, err := httpsink.New(httpsink.Config{URL: rc.URL()}, nil)
	require.NoError(t, err)
	cfg := e.config()
	cfg.Route = "orders"
	cfg.Topics = []string{"t"}
	r, _ := e.start(cfg, sink)
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	status := func() operator.Status {
		t.Helper()
		st, err := admin.Status(context.Background())
		require.NoError(t, err)
		return st
	}

	e.write(msg("t", "k0", "before"))
	eventually(t, 20*time.Second, func() bool { return rc.Accepted() == 1 }, "first delivery")
	st := status()
	require.Len(t, st.Relays, 1)
	require.Equal(t, operator.Delivering, st.Relays[0].State)
	require.Nil(t, st.Relays[0].DownSince)

	rc.Stop()
	opened := r.SignalCount(relay.SigOutage)
	for i := range 10 {
		e.write(msg("t", fmt.Sprintf("k%d", i%3), fmt.Sprintf("m%d", i)))
	}
	r.AwaitSignal(t, signalBound, relay.SigOutage, opened, func(v int) bool { return v == 1 })
	probes := r.SignalCount(relay.SigProbed)
	r.AwaitSignal(t, signalBound, relay.SigProbed, probes+1, nil)
	testkit.Eventually(t, signalBound, 20*time.Millisecond, func() (bool, string) {
		st = status()
		return len(st.Relays) == 1 && st.Relays[0].State == operator.DestinationDown && st.Relays[0].DownProbes > 0,
			fmt.Sprintf("relays %+v", st.Relays)
	})
	down := st.Relays[0]
	require.NotNil(t, down.DownSince)
	require.False(t, down.DownSince.After(st.Now), "bounded by the database's clock")
	require.WithinDuration(t, r.State().Since, *down.DownSince, time.Second, "the breaker's since, as the relay's clock saw it")
	require.Contains(t, down.DownCause, "not sent")
	require.LessOrEqual(t, len([]rune(down.DownCause)), 500)
	require.Equal(t, []operator.RouteHealth{{Route: "orders", Relays: 1, RelaysDown: 1, Delivery: down.Delivery}}, st.Routes)

	require.NoError(t, rc.Start())
	eventually(t, 20*time.Second, func() bool { return e.count("messages") == 0 }, "outbox drained")
	testkit.Eventually(t, signalBound, 20*time.Millisecond, func() (bool, string) {
		st = status()
		return len(st.Relays) == 1 && st.Relays[0].State == operator.Delivering, fmt.Sprintf("relays %+v", st.Relays)
	})
	require.Nil(t, st.Relays[0].DownSince)
	require.Empty(t, st.Relays[0].DownCause)
	require.Zero(t, st.Relays[0].DownProbes)
	require.Equal(t, operator.Delivering, st.Routes[0].State)
	var nulls bool
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT down_since IS NULL AND down_cause IS NULL AND down_probes = 0 FROM "+e.table("relays")).Scan(&nulls))
	require.True(t, nulls, "a delivering route's relay row says nothing of an outage")
}
