package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// payload is what the writers put in every message: the key, the
// message's position in its key's write order, and a tag naming the
// writing transaction and the message within it.
type payload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	Tag string `json:"tag"`
	// Amount makes the message a posting to the key's account: the
	// amounts of one transaction sum to zero (a transfer between the
	// accounts it locks). TestChaosInbox checks the consumer's balances.
	Amount int64 `json:"amount"`
	// Source names the database the message was written in, where a
	// test writes in several (TestChaosManyDatabases): keys and tags are
	// a source's own.
	Source string `json:"source,omitempty"`
}

// delivery is one message the receiver accepted (answered 2xx), in arrival
// order.
type delivery struct {
	id  string    // webhook-id: the stable message id
	key string    // outbox-key header, decoded
	at  time.Time // when the receiver accepted it (zero where not recorded)
	// producer is the outbox-producer header: the outbox the relay read
	// the message from.
	producer string
	payload
}

// receiver is the consumer: a real HTTP server on loopback that records
// every request it accepts. It records before it answers, and the HTTP
// sink sends the next message of a key only after the previous one got its
// answer, so the recorded order per key is the order the relays delivered.
type receiver struct {
	url string

	failing  atomic.Pointer[hold] // set while the receiver answers 503
	rejected atomic.Int64
	// poison, when set and poisoning, says which messages the receiver
	// refuses for good (422: the relay dead-letters them at once).
	poison    func(tag string) bool
	poisoning atomic.Bool
	poisoned  atomic.Int64
	holding   atomic.Pointer[hold] // set while the receiver stalls
	stalled   atomic.Int64

	mu  sync.Mutex
	log []delivery
	bad []string
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.url = testkit.NewTestReceiver(t, rc.serve).URL()
	return rc
}

func (rc *receiver) serve(r *testkit.Request) (int, string) {
	if h := rc.holding.Load(); h != nil {
		// A consumer that is slow to answer: the request is processed
		// (recorded) after the stall even if the relay gave up on it,
		// as a real consumer would.
		rc.stalled.Add(1)
		h.caught.Do(func() { close(h.first) })
		<-h.release
	}
	if f := rc.failing.Load(); f != nil {
		rc.rejected.Add(1)
		f.caught.Do(func() { close(f.first) })
		return http.StatusServiceUnavailable, "receiver outage (chaos test)"
	}
	d := delivery{id: r.Header.Get("webhook-id"), at: time.Now(), producer: r.Header.Get("outbox-producer")}
	var problem string
	key, kerr := url.PathUnescape(r.Header.Get("outbox-key"))
	d.key = key
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/hook":
		problem = fmt.Sprintf("%s %s", r.Method, r.URL.Path)
	case d.id == "":
		problem = "no webhook-id header"
	case kerr != nil:
		problem = fmt.Sprintf("outbox-key %q: %v", r.Header.Get("outbox-key"), kerr)
	default:
		if err := json.Unmarshal(r.Body, &d.payload); err != nil {
			problem = fmt.Sprintf("payload %q: %v", r.Body, err)
		} else if d.payload.Key != d.key {
			problem = fmt.Sprintf("outbox-key %q but payload key %q", d.key, d.payload.Key)
		}
	}
	if problem == "" && rc.poison != nil && rc.poisoning.Load() && rc.poison(d.Tag) {
		rc.poisoned.Add(1)
		return http.StatusUnprocessableEntity, "poison message (chaos test)"
	}
	rc.mu.Lock()
	if problem != "" {
		// Accepted anyway, so that the problem is reported once, here,
		// rather than as a dead letter.
		rc.bad = append(rc.bad, problem)
	} else {
		rc.log = append(rc.log, d)
	}
	rc.mu.Unlock()
	return http.StatusNoContent, ""
}

// hold is one fault window of the receiver (an outage or a stall). Its
// length counts from the first request it catches, so a window that opens
// while every relay happens to be restarting still catches traffic: a
// fault that met no request would prove nothing.
type hold struct {
	caught  sync.Once
	first   chan struct{} // closed by the first request caught
	release chan struct{} // closed when the window ends
}

func newHold() *hold { return &hold{first: make(chan struct{}), release: make(chan struct{})} }

// window waits for h's first request (at most a minute), then for d.
func (h *hold) window(ctx context.Context, d time.Duration) {
	select {
	case <-h.first:
	case <-ctx.Done():
	case <-time.After(time.Minute):
	}
	sleepCtx(ctx, d)
}

// outage makes the receiver answer 503 to everything for d, counted from
// the first request it rejects.
func (rc *receiver) outage(ctx context.Context, d time.Duration) {
	h := newHold()
	rc.failing.Store(h)
	defer rc.failing.Store(nil)
	h.window(ctx, d)
}

// stall holds every request for d, counted from the first request it
// holds, before accepting it: longer than the relays' publish timeout, so
// their sends time out although the receiver goes on to process the
// messages.
func (rc *receiver) stall(ctx context.Context, d time.Duration) {
	h := newHold()
	rc.holding.Store(h)
	h.window(ctx, d)
	rc.holding.Store(nil)
	close(h.release)
}

// snapshot returns the deliveries so far and the malformed requests.
func (rc *receiver) snapshot() ([]delivery, []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.log...), append([]string(nil), rc.bad...)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.log)
}
