package httpsink

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// skew makes the sink's host clock read off by d.
func skew(s *Sink, d time.Duration) {
	s.now = func() time.Time { return time.Now().Add(d) }
}

// verifyingReceiver answers 400 to a request that a Standard Webhooks
// receiver would refuse (bad signature, or a timestamp more than five
// minutes from its clock), 204 otherwise.
func verifyingReceiver(t *testing.T) *receiver {
	rc := newReceiver(t)
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) int {
		if err := verifySignature(secretA, r.Header, body, time.Now(), signatureTolerance); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return http.StatusBadRequest
		}
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	})
	return rc
}

func webhookTime(t *testing.T, r request) time.Time {
	t.Helper()
	sec, err := strconv.ParseInt(r.Header.Get(HeaderWebhookTimestamp), 10, 64)
	require.NoError(t, err)
	return time.Unix(sec, 0)
}

// TestRelayClockSkewWebhookTimestamp: a relay host whose clock is two hours
// slow must not get every webhook refused as a replay. webhook-timestamp
// is the send time on the database's clock: the claim time
// (Message.ClaimedAt) plus the time elapsed since Send began.
func TestRelayClockSkewWebhookTimestamp(t *testing.T) {
	t.Parallel()
	rc := verifyingReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/hook"), Secrets: []sinkconf.Secret{secretA}})
	skew(s, -2*time.Hour)

	m := msg(sinksID(), "t", "k", `{"n":1}`, nil)
	m.CreatedAt = time.Now().Add(-time.Hour) // a backlog: irrelevant to the send time
	m.ClaimedAt = time.Now()
	err := sinks.Outcome(s.Send(context.Background(), []sinks.Message{m}), 0, 1)
	require.NoError(t, err, "permanent: %v", sinks.IsPermanent(err))
	require.WithinDuration(t, time.Now(), webhookTime(t, rc.requests()[0]), 2*time.Second)
}

// TestWebhookTimestampFollowsTheDatabaseClock: the relay host's clock plays
// no part when the message carries the database's. With the database ten
// minutes ahead of the relay (and of the receiver), webhook-timestamp is
// ten minutes ahead too, and it advances with the time the Send takes.
// Without ClaimedAt (a caller outside the relay) the host's clock is used.
func TestWebhookTimestampFollowsTheDatabaseClock(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	slow := map[string]bool{"a": true, "b": true}
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) int {
		if slow[string(body)] {
			// A receiver slow to answer is the subject: the time Send
			// spends waiting must show in the next webhook-timestamp.
			time.Sleep(1100 * time.Millisecond)
		}
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	})
	s := newSink(t, Config{URL: rc.URL("/hook")})

	dbAhead := 10 * time.Minute
	claimed := time.Now().Add(dbAhead)
	var msgs []sinks.Message
	for _, p := range []string{"a", "b", "c"} {
		m := msg(sinksID(), "t", "one-key", p, nil)
		m.ClaimedAt = claimed
		msgs = append(msgs, m)
	}
	require.NoError(t, s.Send(context.Background(), msgs))
	reqs := rc.requests()
	require.Len(t, reqs, 3)
	first, last := webhookTime(t, reqs[0]), webhookTime(t, reqs[2])
	require.WithinDuration(t, time.Now().Add(dbAhead), first, 4*time.Second, "the database's clock, not the host's")
	require.GreaterOrEqual(t, last.Sub(first), 2*time.Second, "the time elapsed in Send is added (2.2 s of slow answers)")

	skew(s, -time.Hour)
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "no claim time", nil)}))
	require.WithinDuration(t, time.Now().Add(-time.Hour), webhookTime(t, rc.requests()[3]), 2*time.Second, "no ClaimedAt: the host's clock")
}
