package relayprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
)

// Each source's state, restarts and waits for its share, as States says
// at the scrape.
func TestSourcesCollector(t *testing.T) {
	states := []relay.SourceState{
		{Name: "tenant-a", State: relay.SourceRunning, ShareWait: 1500 * time.Millisecond},
		{Name: "tenant-b", State: relay.SourceDown, Restarts: 2},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(relayprom.NewSourcesCollector(func() []relay.SourceState { return states }))
	want := `
# HELP outbox_relay_source_restarts_total Times the source's relays started again after stopping with an error.
# TYPE outbox_relay_source_restarts_total counter
outbox_relay_source_restarts_total{source="tenant-a"} 0
outbox_relay_source_restarts_total{source="tenant-b"} 2
# HELP outbox_relay_source_share_wait_seconds_total How long the source's workers waited for its part of the batches under way while other sources had work (--source-batches, weight:): time the source was held back.
# TYPE outbox_relay_source_share_wait_seconds_total counter
outbox_relay_source_share_wait_seconds_total{source="tenant-a"} 1.5
outbox_relay_source_share_wait_seconds_total{source="tenant-b"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"outbox_relay_source_restarts_total", "outbox_relay_source_share_wait_seconds_total"))
	require.Equal(t, 8+4, testutil.CollectAndCount(relayprom.NewSourcesCollector(func() []relay.SourceState { return states })),
		"4 states, a restart and a wait series for each of 2 sources")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}
