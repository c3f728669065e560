package httpsink

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// rateBound fails t when some stretch of the arrival times holds more
// requests than a token bucket of rate and burst lets through: the bound
// a rate limit promises whatever the machine's speed (a slow machine only
// spreads them further).
func rateBound(t *testing.T, at []time.Time, rate float64, burst int) {
	t.Helper()
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// The limiter bounds when requests may leave; each arrives a little
	// after, by the scheduling delay of a loaded machine (which can bring
	// two closer together): 100 ms of slack per window. Without the limit
	// the 60 requests arrive within milliseconds.
	const slack = 100 * time.Millisecond
	for i := range at {
		for j := i; j < len(at); j++ {
			span := at[j].Sub(at[i]) + slack
			allowed := float64(burst) + rate*span.Seconds()
			require.LessOrEqual(t, float64(j-i+1), allowed+1e-9,
				"%d requests within %s: more than a burst of %d plus %.0f/s", j-i+1, span, burst, rate)
		}
	}
}

// rate_limit bounds the requests to a host, whatever the keys and however
// many Sends run at once.
func TestRateLimitPerHost(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	var mu sync.Mutex
	var at []time.Time
	rc.setRespond(func(w http.ResponseWriter, _ *http.Request, _ []byte) int {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	})
	const rate, burst = 40, 4
	s := newSink(t, Config{URL: rc.URL("/"), RateLimit: rate, RateBurst: burst, MaxConcurrency: 16})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			msgs := make([]sinks.Message, 30)
			for i := range msgs {
				msgs[i] = msg(sinksID(), "t", fmt.Sprintf("k%d-%d", w, i), "x", nil)
			}
			require.NoError(t, s.Send(context.Background(), msgs))
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, at, 60)
	rateBound(t, at, rate, burst)
}

func TestRateLimitValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "http://127.0.0.1:1/", RateLimit: -1}, "rate_limit: must be a number of requests a second"},
		{Config{URL: "http://127.0.0.1:1/", RateBurst: 3}, "rate_burst: must be at least 1, and only with rate_limit"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
	}
	c, err := ParseURL("http://127.0.0.1:1/hook?rate_limit=12.5&rate_burst=3")
	require.NoError(t, err)
	require.Equal(t, 12.5, c.RateLimit)
	require.Equal(t, 3, c.RateBurst)
	require.Equal(t, 13, Config{URL: "http://127.0.0.1:1/", RateLimit: 12.5}.withDefaults().RateBurst)
}
