package faults

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// Messages a receiver fails on while it takes every other one are
// poison, not an outage: they count their attempts and are dead-lettered,
// and the route keeps delivering. A receiver that is down as a whole
// (every request, a request without a message too) costs no attempts,
// however it says so. These are the red-team scenarios of a receiver
// answering 503, no answer in time, or 500: the HTTP sink asks the
// receiver about itself with a HEAD request (sinks.Prober) before a 5xx
// or a timeout reads as an outage.

// marked is the payload of a message the poison receivers fail on.
func marked(key string, i int) string { return payloadOf("marked", key, i) }

func isMarked(body []byte) bool { return strings.HasPrefix(string(body), "marked|") }

// poison503Receiver is up (it answers the sink's HEAD with 200) and
// answers 503 to the marked messages only.
func poison503Receiver(t *testing.T) *receiver {
	rc := newReceiver(t, func(_ *http.Request, body []byte) (int, string) {
		if isMarked(body) {
			return http.StatusServiceUnavailable, "cannot take this one"
		}
		return http.StatusNoContent, ""
	})
	rc.SetHealth(func() int { return http.StatusOK })
	return rc
}

// stallFlags: few attempts, quick retries (the red team's relay).
var stallFlags = []string{"--max-attempts", "3", "--retry-initial", "1s", "--retry-max", "5s"}

// TestPoison503DeadLetters: two messages, on two keys, that the receiver
// answers 503 while it takes everything else, and nothing else pending.
// Before, the route read two keys' 503s as the receiver being down and
// probed them forever with no attempt counted.
func TestPoison503DeadLetters(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	rc := poison503Receiver(t)
	commit(t, pool, schema, []outbox.Message{
		{Topic: "orders", Key: "k1", Payload: []byte(marked("k1", 0))},
		{Topic: "orders", Key: "k2", Payload: []byte(marked("k2", 1))},
	})
	want := commit(t, pool, schema, messages("orders", []string{"k1", "k2"}, 2, 4, nil))
	p := startRelay(t, pgtest.URL(), schema, append(stallFlags, "--workers", "1", "--sink", rc.url())...)
	eventually(t, 90*time.Second, 100*time.Millisecond, func() (bool, string) {
		n := len(deadLetters(t, pool, schema))
		return n == 2 && count(t, pool, schema, "messages") == 0,
			fmt.Sprintf("%d dead letters, %d pending", n, count(t, pool, schema, "messages"))
	})
	for _, d := range deadLetters(t, pool, schema) {
		require.Equal(t, relay.ReasonMaxAttempts, d.Reason)
		require.Equal(t, 3, d.Attempts)
		require.Contains(t, *d.LastError, "503")
	}
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	outages, _ := p.metric("outbox_relay_destination_outages_total")
	require.Zero(t, outages, "the route was read as down")
}

// TestPoisonTimeoutDeadLetters: 60 messages over 6 keys, every fifth of
// which the receiver holds past the sink's timeout. Before, the route
// stalled for good once every key's head was such a message.
func TestPoisonTimeoutDeadLetters(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	rc := newReceiver(t, func(r *http.Request, body []byte) (int, string) {
		if isMarked(body) {
			// A handler stuck on this message until the sink gives up.
			<-r.Context().Done()
			return http.StatusInternalServerError, "too late"
		}
		return http.StatusNoContent, ""
	})
	rc.SetHealth(func() int { return http.StatusOK })
	keys := keyNames("k", 6)
	var msgs []outbox.Message
	var want []string
	for i := range 60 {
		k := keys[i%len(keys)]
		if i%5 == 4 {
			msgs = append(msgs, outbox.Message{Topic: "orders", Key: k, Payload: []byte(marked(k, i))})
			continue
		}
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: k, Payload: []byte(payloadOf("orders", k, i))})
		want = append(want, payloadOf("orders", k, i))
	}
	commit(t, pool, schema, msgs)
	startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", rc.url()+"?timeout=1s")...)
	eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		n, left := len(deadLetters(t, pool, schema)), count(t, pool, schema, "messages")
		return n == 12 && left == 0, fmt.Sprintf("%d dead letters, %d pending", n, left)
	})
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Len(t, got, 48)
}

// pacedWriter commits one message every 1/rate seconds for d, spread over
// keys; mark says which messages the receiver fails on. It returns the
// payloads committed and when each committed.
func pacedWriter(t *testing.T, pool *pgxpool.Pool, schema string, rate int, d time.Duration,
	keys func(i int) string, mark func(i int) bool) (payloads []string, at map[string]time.Time) {
	t.Helper()
	at = map[string]time.Time{}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; i < int(d.Seconds()*float64(rate)); i++ {
		<-tick.C
		k := keys(i)
		p := payloadOf("orders", k, i)
		if mark(i) {
			p = marked(k, i)
		}
		commit(t, pool, schema, []outbox.Message{{Topic: "orders", Key: k, Payload: []byte(p)}})
		payloads = append(payloads, p)
		at[p] = time.Now()
	}
	return payloads, at
}

// p99 is the 99th percentile of the commit-to-receiver latencies of the
// payloads in want.
func p99(t *testing.T, got []delivery, at map[string]time.Time) time.Duration {
	t.Helper()
	var lat []time.Duration
	for _, d := range got {
		if c, ok := at[d.Payload]; ok {
			lat = append(lat, d.At.Sub(c))
		}
	}
	require.NotEmpty(t, lat)
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// TestPoisonBesideGoodTraffic: a third of the traffic is poison (503 on
// keys of its own) beside good messages on 50 other keys. The good
// messages' latency stays within twice what it is without the poison,
// measured first in the same run.
func TestPoisonBesideGoodTraffic(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	rc := poison503Receiver(t)
	startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", rc.url())...)
	good := func(i int) string { return fmt.Sprintf("g%d", i%50) }
	never := func(int) bool { return false }
	base, baseAt := pacedWriter(t, pool, schema, 20, 10*time.Second, good, never)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		return len(rc.deliveries()) >= len(base), "baseline delivered"
	})
	baseline := p99(t, rc.deliveries(), baseAt)

	// 30/s: every third message poison, on keys of its own.
	mixedKeys := func(i int) string {
		if i%3 == 2 {
			return fmt.Sprintf("p%d", i)
		}
		return good(i)
	}
	mixed, mixedAt := pacedWriter(t, pool, schema, 30, 20*time.Second, mixedKeys, func(i int) bool { return i%3 == 2 })
	for p := range mixedAt {
		if strings.HasPrefix(p, "marked|") {
			delete(mixedAt, p)
		}
	}
	poisoned := len(mixed) - len(mixedAt)
	eventually(t, 90*time.Second, 100*time.Millisecond, func() (bool, string) {
		n := len(deadLetters(t, pool, schema))
		return n == poisoned && count(t, pool, schema, "messages") == 0, fmt.Sprintf("%d of %d poisons dead-lettered", n, poisoned)
	})
	during := p99(t, rc.deliveries(), mixedAt)
	t.Logf("good messages' p99: %s alone, %s beside %d poison messages", baseline, during, poisoned)
	require.LessOrEqual(t, during, 2*baseline+10*time.Millisecond,
		"the good messages' p99 went from %s to %s beside the poison", baseline, during)
}

// flapping answers 503 to everything, a request without a message too,
// for a second, then takes everything for a second, and so on.
type flapping struct {
	mu    sync.Mutex
	start time.Time
}

func (f *flapping) down() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.start.IsZero() {
		f.start = time.Now()
	}
	return time.Since(f.start)/time.Second%2 == 0
}

// TestFlappingReceiverDeadLettersNothing: a receiver that is down for a
// second and up for a second, under 50 messages a second over 50 keys:
// the messages that met its down half spend no attempts, and nothing is
// dead-lettered although each message has only 3.
func TestFlappingReceiverDeadLettersNothing(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	f := &flapping{}
	rc := newReceiver(t, func(*http.Request, []byte) (int, string) {
		if f.down() {
			return http.StatusServiceUnavailable, "flapping"
		}
		return http.StatusNoContent, ""
	})
	rc.SetHealth(func() int {
		if f.down() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", rc.url())...)
	d := 20 * time.Second
	if long() {
		d = time.Minute
	}
	want, _ := pacedWriter(t, pool, schema, 50, d, func(i int) string { return fmt.Sprintf("k%d", i%50) },
		func(int) bool { return false })
	eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		return count(t, pool, schema, "messages") == 0, fmt.Sprintf("%d pending", count(t, pool, schema, "messages"))
	})
	require.Zero(t, len(deadLetters(t, pool, schema)), "a flapping receiver dead-lettered messages")
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
}

// TestReceiver500ToEverythingDeadLettersNothing: a receiver whose own
// database is down answers 500 to every request, a request without a
// message too, for 20 s under 20 messages a second: an outage, whatever
// the code, that spends no attempts.
func TestReceiver500ToEverythingDeadLettersNothing(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	var mu sync.Mutex
	broken := false
	isBroken := func() bool { mu.Lock(); defer mu.Unlock(); return broken }
	rc := newReceiver(t, func(*http.Request, []byte) (int, string) {
		if isBroken() {
			return http.StatusInternalServerError, "database unavailable"
		}
		return http.StatusNoContent, ""
	})
	rc.SetHealth(func() int {
		if isBroken() {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	p := startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", rc.url())...)
	keys := func(i int) string { return fmt.Sprintf("k%d", i%40) }
	none := func(int) bool { return false }
	want, _ := pacedWriter(t, pool, schema, 20, time.Second, keys, none)
	mu.Lock()
	broken = true
	mu.Unlock()
	during, _ := pacedWriter(t, pool, schema, 20, 20*time.Second, keys, none)
	var attempts int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(max(attempts), 0) FROM `+migrations.Ident(schema)+`.messages`).Scan(&attempts))
	mu.Lock()
	broken = false
	mu.Unlock()
	want = append(want, during...)
	eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		return count(t, pool, schema, "messages") == 0, fmt.Sprintf("%d pending", count(t, pool, schema, "messages"))
	})
	require.Zero(t, len(deadLetters(t, pool, schema)), "500s to everything dead-lettered messages")
	require.Zero(t, attempts, "attempts counted during the outage")
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	outages, _ := p.metric("outbox_relay_destination_outages_total")
	require.NotZero(t, outages)
}
