package httpsink

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// dripFeed answers status at once, then writes the body one byte every
// 100 ms for up to 10 s, stopping when the client goes away.
func dripFeed(status int) func(w http.ResponseWriter, r *http.Request, _ []byte) int {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) int {
		w.WriteHeader(status)
		_, _ = w.Write([]byte("first bytes "))
		w.(http.Flusher).Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for range 100 {
			select {
			case <-r.Context().Done():
				return status
			case <-tick.C:
			}
			if _, err := w.Write([]byte("x")); err != nil {
				return status
			}
			w.(http.Flusher).Flush()
		}
		return status
	}
}

// TestDripFedBodyDoesNotHoldTheSend: a receiver that answers 2xx at once
// and then drip-feeds its body has accepted the message; the sink must not
// spend the request timeout (30 s by default) reading what follows. Nor
// should a drip-fed error body hold the Send: its start is enough for the
// error.
func TestDripFedBodyDoesNotHoldTheSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
	}{{"2xx", http.StatusOK}, {"4xx", http.StatusBadRequest}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t)
			rc.setRespond(dripFeed(tc.status))
			s := newSink(t, Config{URL: rc.URL("/hook")})
			const n = 2 // one key: one after the other
			var msgs []sinks.Message
			for range n {
				msgs = append(msgs, msg(sinksID(), "t", "k", "x", nil))
			}
			start := time.Now()
			err := s.Send(context.Background(), msgs)
			took := time.Since(start)
			t.Logf("%d messages to a receiver drip-feeding a %d body: Send took %s", n, tc.status, took.Round(time.Millisecond))
			// Generous (a second of slack per message) for -race on a loaded
			// machine; an unbounded body read would drip for far longer.
			require.Less(t, took, n*(bodyReadTimeout+time.Second), "the body read is not bounded")
			if tc.status == http.StatusOK {
				require.NoError(t, err)
				return
			}
			var se *StatusError
			require.ErrorAs(t, sinks.Outcome(err, 0, n), &se)
			require.ErrorIs(t, sinks.Outcome(err, 1, n), sinks.ErrNotAttempted)
			require.True(t, strings.HasPrefix(se.Body, "first bytes"), se.Body)
		})
	}
}
