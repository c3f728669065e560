package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// slowReceiver answers every request of topic "slow" after 2s, and later
// while the other requests still flow: not before an answer to them is
// a second old (at most 8s, within the relay's publish timeout). Every
// other request it answers at once. On a loaded machine the other keys
// flow slower, and the slow key then waits longer, instead of the other
// keys being measured against a fixed 10s.
func slowReceiver(t testing.TB) *receiver {
	var lastFast atomic.Int64 // unix nanos of the last other request
	return newReceiver(t, func(r *http.Request, _ []byte) (int, string) {
		if topic, _ := url.PathUnescape(r.Header.Get("outbox-topic")); topic != "slow" {
			lastFast.Store(time.Now().UnixNano())
			return http.StatusNoContent, ""
		}
		start := time.Now()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			held := time.Since(start)
			quiet := time.Since(time.Unix(0, lastFast.Load()))
			if held >= 8*time.Second || (held >= 2*time.Second && quiet >= time.Second) {
				return http.StatusNoContent, ""
			}
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return http.StatusServiceUnavailable, "gone"
			}
		}
	})
}

// TestSlowSinkOtherKeysFlow: one key's receiver takes at least 2s per
// message, longer while the other keys still flow (see slowReceiver: a
// slow machine does not fail the test, and a relay that blocked the
// other keys behind the slow one still does). The other keys must keep
// flowing while that key's messages wait. A worker
// publishes a whole batch in one Send; once the batch has been with the
// sink for as long as its claim took, the worker claims its next batch
// from its other lanes (the pipeline), so only the keys that share the
// slow key's batch wait for the slow chain. Measured with the default 2
// workers (61 % before the pipeline, 99 % with it) and with 8.
func TestSlowSinkOtherKeysFlow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		workers int
		floor   float64 // share of other keys delivered while the slow key waits
	}{{2, 0.9}, {8, 0.75}} {
		t.Run(fmt.Sprintf("workers=%d", tc.workers), func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.Schema(t)
			rc := slowReceiver(t)

			const slowN, fastN = 5, 4000
			wantSlow := commit(t, pool, schema, messages("slow", []string{"slow-key"}, 0, slowN, nil))
			wantFast := commit(t, pool, schema, messages("fast", keyNames("k", 200), 0, fastN, nil))
			start := time.Now()
			startRelay(t, pgtest.URL(), schema, "--sink", rc.url(), "--workers", fmt.Sprint(tc.workers))

			eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
				left := count(t, pool, schema, "messages")
				return left == 0, fmt.Sprintf("%d pending", left)
			})
			got := rc.deliveries()
			checkAllDelivered(t, append(wantSlow, wantFast...), got)
			checkKeyOrder(t, got)
			require.Empty(t, deadLetters(t, pool, schema))

			var lastSlow time.Time
			var fastAt []time.Duration
			for _, d := range got {
				if d.Topic == "slow" {
					lastSlow = maxTime(lastSlow, d.At)
				} else {
					fastAt = append(fastAt, d.At.Sub(start))
				}
			}
			sort.Slice(fastAt, func(i, j int) bool { return fastAt[i] < fastAt[j] })
			flowed := 0
			for _, at := range fastAt {
				if at < lastSlow.Sub(start) {
					flowed++
				}
			}
			share := float64(flowed) / fastN
			t.Logf("workers %d: slow key %d messages x 2s, last one after %s; other keys: %d of %d (%.0f%%) delivered while the slow key waited; "+
				"other keys delivered after p50 %s, p90 %s, max %s",
				tc.workers, slowN, lastSlow.Sub(start).Round(time.Millisecond), flowed, fastN, 100*share,
				pct(fastAt, 50), pct(fastAt, 90), fastAt[len(fastAt)-1].Round(time.Millisecond))
			require.GreaterOrEqual(t, lastSlow.Sub(start), time.Duration(slowN)*2*time.Second, "the slow key's messages go one at a time")
			require.GreaterOrEqual(t, share, tc.floor, "other keys kept flowing")
		})
	}
}

// TestSlowSinkMemoryBounded: a 310 MB backlog of messages whose receiver
// takes 2s each. The relay holds at most its in-flight batches (two
// workers, two batches each: 32 MB of payload), so its memory stays
// below half the backlog; once the receiver is fast again everything
// arrives and nothing was dead-lettered.
func TestSlowSinkMemoryBounded(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	var slow atomic.Bool
	var slowAnswers atomic.Int64
	slow.Store(true)
	rc := newReceiver(t, func(r *http.Request, _ []byte) (int, string) {
		if slow.Load() {
			// A slow receiver is the subject: 2s per answer.
			select {
			case <-time.After(2 * time.Second):
				slowAnswers.Add(1)
			case <-r.Context().Done():
				return http.StatusServiceUnavailable, "gone"
			}
		}
		return http.StatusNoContent, ""
	})

	const n, size = 20_000, 16 << 10
	_, err := pool.Exec(context.Background(), `INSERT INTO `+migrations.Ident(schema)+`.messages (topic, key, payload)
SELECT 'slow', 'k' || (g % 100), convert_to(rpad(g::text, $1, 'x'), 'UTF8') FROM generate_series(0, $2 - 1) g`, size, n)
	require.NoError(t, err)
	var backlogBytes int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT sum(octet_length(payload)) FROM `+migrations.Ident(schema)+`.messages`).Scan(&backlogBytes))

	p := startRelay(t, pgtest.URL(), schema, "--sink", rc.url(), "--publish-timeout", "4s", "--retry-initial", "200ms", "--retry-max", "1s")
	var peakRSS, peakHeap int64
	// Memory is sampled while the relay works against the slow receiver:
	// until it has had 40 slow answers (about four rounds of the requests
	// the relay keeps in flight, some 10s), however long that takes on
	// this machine.
	start := time.Now()
	eventually(t, 120*time.Second, 100*time.Millisecond, func() (bool, string) {
		rss, _, err := p.memory()
		require.NoError(t, err)
		peakRSS = max(peakRSS, rss)
		if h, err := p.metric("go_memstats_heap_inuse_bytes"); err == nil {
			peakHeap = max(peakHeap, int64(h))
		}
		return slowAnswers.Load() >= 40, fmt.Sprintf("%d slow answers", slowAnswers.Load())
	})
	window := time.Since(start).Round(time.Millisecond)
	deliveredSlow := distinct(rc.deliveries())
	pending := count(t, pool, schema, "messages")
	slow.Store(false)
	eventually(t, 90*time.Second, 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	require.Equal(t, n, distinct(rc.deliveries()), "every message arrived once the receiver was fast again")
	require.Empty(t, deadLetters(t, pool, schema))
	_, hwm, err := p.memory()
	require.NoError(t, err)
	t.Logf("backlog %d messages, %d MB; over %s with a 2s receiver: %d delivered, %d pending; relay peak RSS %d MB, peak Go heap in use %d MB; VmHWM after the drain %d MB",
		n, backlogBytes>>20, window, deliveredSlow, pending, peakRSS>>20, peakHeap>>20, hwm>>20)
	require.Greater(t, pending, n/2, "the backlog was still there while memory was measured")
	require.Less(t, peakRSS, backlogBytes/2, "relay memory must be bounded by its batches, not the backlog")
}
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, len(sorted)*p/100)
	return sorted[i].Round(time.Millisecond)
}
