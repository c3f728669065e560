package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// timedSink records when each message reached it, and the batch sizes.
type timedSink struct {
	*memory.Sink
	mu      sync.Mutex
	at      []time.Time
	largest int
}

func (s *timedSink) Send(ctx context.Context, msgs []sinks.Message) error {
	now := time.Now()
	s.mu.Lock()
	for range msgs {
		s.at = append(s.at, now)
	}
	s.largest = max(s.largest, len(msgs))
	s.mu.Unlock()
	return s.Sink.Send(ctx, msgs)
}

// RateLimit bounds the route's deliveries, shared by its workers: no
// stretch of the run holds more messages than a burst plus the rate, and
// no batch is larger than the burst.
func TestRateLimitBoundsTheRoute(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 120 {
		e.write(msg("t", fmt.Sprintf("k%d", i%7), strconv.Itoa(i)))
	}
	sink := &timedSink{Sink: memory.New()}
	cfg := e.config()
	cfg.RateLimit, cfg.RateBurst = 60, 8
	e.start(cfg, sink)
	require.NoError(t, sink.WaitFor(waitCtx(t, 30*time.Second), 120))
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.LessOrEqual(t, sink.largest, 8)
	at := sink.at
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// The limiter bounds when batches may go; each reaches the sink a
	// little after, by the scheduling delay of a loaded machine (which
	// can bring two batches closer together): 100 ms of slack per window.
	// Without the limit the 120 messages arrive within milliseconds.
	for i := range at {
		for j := i; j < len(at); j++ {
			span := at[j].Sub(at[i]) + 100*time.Millisecond
			require.LessOrEqual(t, float64(j-i+1), 8+60*span.Seconds(),
				"%d messages within %s: more than a burst of 8 plus 60/s", j-i+1, span)
		}
	}
}

// A 429 with Retry-After pauses the whole route for that long, not only
// the message that got it.
func TestRetryAfterPausesTheRoute(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var refused atomic.Bool
	var mu sync.Mutex
	var at []time.Time // arrivals of the other keys' requests
	rc := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if r.Header.Get(httpsink.HeaderKey) == "slow" {
			if refused.CompareAndSwap(false, true) {
				r.Reply.Set("Retry-After", "1")
				return http.StatusTooManyRequests, "slow down"
			}
			return http.StatusNoContent, ""
		}
		mu.Lock()
		at = append(at, r.At)
		mu.Unlock()
		return http.StatusNoContent, ""
	})
	sink, err := httpsink.New(httpsink.Config{URL: rc.URL()}, nil)
	require.NoError(t, err)
	cfg := e.config()
	// One batch at a time: none is in flight beside the one that gets
	// the 429.
	cfg.Workers, cfg.Pipeline = 1, 1
	e.write(msg("t", "slow", "1"))
	r, _ := e.start(cfg, sink)
	var until time.Time
	eventually(t, 20*time.Second, func() bool { until = r.State().PausedUntil; return !until.IsZero() }, "the route paused")
	for i := range 20 {
		e.write(msg("t", fmt.Sprintf("k%d", i), "2"))
	}
	eventually(t, 30*time.Second, func() bool { return e.count("messages") == 0 }, "all delivered")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, at, 20)
	for _, a := range at {
		require.False(t, a.Before(until), "a request at %s, before the pause ended at %s", a, until)
	}
}
