package faults

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// TestWebhookRateLimit is a partner API that allows 50 requests a second
// (a token bucket of 50 a second with a burst of 50, answering 429 with
// Retry-After: 1 beyond it) and a relay told to stay a little under it
// (`rate_limit=45` on the webhook URL), draining a backlog of 400
// messages over many keys: no request is refused, and the relay drains at
// its limit. The margin is for the two buckets' clocks: the relay's
// counts a request when it leaves, the receiver's when it arrives, and a
// scheduling delay between the two can bunch requests (with both at 50, 4
// of 400 requests got a 429 on a loaded machine; each paused the route
// for its Retry-After).
func TestWebhookRateLimit(t *testing.T) {
	t.Parallel()
	const limit, relayLimit, backlog = 50, 45, 400
	pool, schema := pgtest.Schema(t)
	bucket := rate.NewLimiter(limit, limit)
	var mu sync.Mutex
	var accepted []time.Time
	refused := 0
	rc := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if !bucket.AllowN(r.At, 1) {
			refused++
			r.Reply.Set("Retry-After", "1")
			return http.StatusTooManyRequests, "50 requests a second"
		}
		accepted = append(accepted, r.At)
		return http.StatusNoContent, ""
	})
	commit(t, pool, schema, messages("orders", keyNames("k", 40), 0, backlog, nil))

	startRelay(t, pgtest.URL(), schema, "--sink", rc.URL()+fmt.Sprintf("?rate_limit=%d", relayLimit))
	eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, deadLetters(t, pool, schema))
	require.GreaterOrEqual(t, len(accepted), backlog)
	slices.SortFunc(accepted, time.Time.Compare)
	// The busiest second of the drain, by arrival at the receiver.
	busiest := 0
	for i := range accepted {
		j := i
		for j < len(accepted) && accepted[j].Sub(accepted[i]) < time.Second {
			j++
		}
		busiest = max(busiest, j-i)
	}
	took := accepted[len(accepted)-1].Sub(accepted[0])
	steady := accepted[relayLimit:]
	steadyRate := float64(len(steady)-1) / steady[len(steady)-1].Sub(steady[0]).Seconds()
	t.Logf("%d messages drained in %s: %d requests accepted, %d answered 429; busiest second %d requests "+
		"(the burst of %d, then the rate); after the burst %.1f requests a second",
		backlog, took.Round(time.Millisecond), len(accepted), refused, busiest, relayLimit, steadyRate)
	require.Zero(t, refused, "429s: the relay exceeded the receiver's limit")
	// Never faster than the limit, by construction of the sink's bucket;
	// a lower bound would be a timed assertion on a loaded machine.
	require.LessOrEqual(t, steadyRate, relayLimit*1.1, "requests a second after the burst")
}
