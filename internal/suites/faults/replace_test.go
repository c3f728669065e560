package faults

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// TestKilledRelayDoesNotBlockItsFix: a relay is SIGKILLed and a relay with
// a corrected sink (another webhook host, so another configuration of the
// route) is started at once, with the default --on-config-change wait.
// The killed relay's registration is still there, its heartbeat young,
// but its lease connection died with it: the replacement does not wait
// for it (which would last the lease TTL, 60 s here) and delivers at
// once. Before, it judged the dead relay live until its heartbeat aged.
func TestKilledRelayDoesNotBlockItsFix(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	wrong, fixed := newReceiver(t, nil), newReceiver(t, nil)
	keys := keyNames("k", 5)
	flags := []string{"--lease-ttl", "60s", "--heartbeat", "20s"}

	commit(t, pool, schema, messages("orders", keys, 0, 10, nil))
	a := startRelay(t, pgtest.URL(), schema, append(flags, "--sink", wrong.url()+"/v1")...)
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return distinct(wrong.deliveries()) == 10, fmt.Sprintf("%d of 10 at the first sink", distinct(wrong.deliveries()))
	})
	require.NoError(t, a.Signal(syscall.SIGKILL))
	a.wait(10 * time.Second)
	second := messages("orders", keys, 10, 10, nil)
	commit(t, pool, schema, second)

	// The kill may land after the first sink acknowledged the first ten
	// but before they were settled: the replacement then delivers them
	// again (the at-least-once bound), so it is waited on for the ten new
	// ones, whatever else it delivers.
	b := startRelay(t, pgtest.URL(), schema, append(flags, "--sink", fixed.url()+"/v2")...)
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		got := map[string]bool{}
		for _, d := range fixed.deliveries() {
			got[d.Payload] = true
		}
		n := 0
		for _, m := range second {
			if got[string(m.Payload)] {
				n++
			}
		}
		return n == len(second), fmt.Sprintf("%d of the %d new messages at the corrected sink (%d distinct in all)", n, len(second), len(got))
	})
	took := time.Since(b.Started())
	t.Logf("the replacement delivered the 10 messages %s after it started", took.Round(time.Millisecond))
	require.Less(t, took, 30*time.Second, "it waited for the dead relay's heartbeat to age (lease TTL 60s)")
	for _, l := range b.logLines() {
		msg, _ := l["msg"].(string)
		require.False(t, strings.Contains(msg, "another configuration"), "the replacement judged the killed relay live: %v", l)
	}
	require.Empty(t, deadLetters(t, pool, schema))
}
