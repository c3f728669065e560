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
}

// delivery is one message the receiver accepted (answered 2xx), in arrival
// order.
type delivery struct {
	id  string // webhook-id: the stable message id
	key string // outbox-key header, decoded
	payload
}

// receiver is the consumer: a real HTTP server on loopback that records
// every request it accepts. It records before it answers, and the HTTP
// sink sends the next message of a key only after the previous one got its
// answer, so the recorded order per key is the order the relays delivered.
type receiver struct {
	url string

	failing  atomic.Bool
	rejected atomic.Int64
	// poison, when set and poisoning, says which messages the receiver
	// refuses for good (422: the relay dead-letters them at once).
	poison    func(tag string) bool
	poisoning atomic.Bool
	poisoned  atomic.Int64
	stallEnd  atomic.Int64 // unix nanos; requests before it are held until then
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
	if end := rc.stallEnd.Load(); end != 0 {
		if d := time.Until(time.Unix(0, end)); d > 0 {
			// A consumer that is slow to answer: the request is processed
			// (recorded) after the stall even if the relay gave up on it,
			// as a real consumer would.
			rc.stalled.Add(1)
			time.Sleep(d)
		}
	}
	if rc.failing.Load() {
		rc.rejected.Add(1)
		return http.StatusServiceUnavailable, "receiver outage (chaos test)"
	}
	d := delivery{id: r.Header.Get("webhook-id")}
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

// outage makes the receiver answer 503 to everything for d.
func (rc *receiver) outage(ctx context.Context, d time.Duration) {
	rc.failing.Store(true)
	defer rc.failing.Store(false)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// stall holds every request for the next d before accepting it: longer
// than the relays' publish timeout, so their sends time out although the
// receiver goes on to process the messages.
func (rc *receiver) stall(ctx context.Context, d time.Duration) {
	rc.stallEnd.Store(time.Now().Add(d).UnixNano())
	sleepCtx(ctx, d)
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
