package httpsink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// request is one POST as the receiver saw it.
type request struct {
	Path   string
	Header http.Header
	Body   []byte
	Status int
}

// receiver is a real net/http server on loopback that records what it is
// sent. respond decides the answer; the default is 204.
type receiver struct {
	t *testing.T

	mu        sync.Mutex
	srv       *httptest.Server
	addr      string
	respond   func(w http.ResponseWriter, r *http.Request, body []byte) int
	all       []request // every request, in arrival order
	delivered []request // 2xx answers only, in arrival order
	cursor    int       // for read
	notify    chan struct{}
	broken    bool // answer 503 to everything
	stopped   bool // stop closed the server; start serves again
	inFlight  map[string]int
	maxInFl   int
	curInFl   int
	overlaps  []string
	onArrive  func(cur int) // called with the in-flight count after a request arrives
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{t: t, notify: make(chan struct{}), inFlight: map[string]int{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	rc.addr = rc.srv.Listener.Addr().String()
	t.Cleanup(func() {
		rc.mu.Lock()
		srv := rc.srv
		rc.mu.Unlock()
		srv.Close()
	})
	return rc
}

// URL returns the receiver's base URL plus p.
func (rc *receiver) URL(p string) string { return "http://" + rc.addr + p }

func (rc *receiver) setRespond(f func(w http.ResponseWriter, r *http.Request, body []byte) int) {
	rc.mu.Lock()
	rc.respond = f
	rc.mu.Unlock()
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	key := r.Header.Get(HeaderKey)
	rc.mu.Lock()
	if key != "" {
		if rc.inFlight[key] > 0 {
			rc.overlaps = append(rc.overlaps, fmt.Sprintf("key %q: two requests in flight at once", key))
		}
		rc.inFlight[key]++
	}
	rc.curInFl++
	rc.maxInFl = max(rc.maxInFl, rc.curInFl)
	cur := rc.curInFl
	respond, broken, onArrive := rc.respond, rc.broken, rc.onArrive
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		rc.curInFl--
		if key != "" {
			rc.inFlight[key]--
		}
		rc.mu.Unlock()
	}()
	if onArrive != nil {
		onArrive(cur)
	}

	status := http.StatusNoContent
	switch {
	case broken:
		status = http.StatusServiceUnavailable
		w.WriteHeader(status)
	case respond != nil:
		status = respond(w, r, body)
	default:
		w.WriteHeader(status)
	}
	req := request{Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Status: status}
	rc.mu.Lock()
	rc.all = append(rc.all, req)
	if status >= 200 && status <= 299 {
		rc.delivered = append(rc.delivered, req)
		close(rc.notify)
		rc.notify = make(chan struct{})
	}
	rc.mu.Unlock()
}

// requests returns every request seen so far.
func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.all...)
}

// read returns the next n delivered requests, waiting until ctx ends.
func (rc *receiver) read(ctx context.Context, n int) ([]request, error) {
	for {
		rc.mu.Lock()
		if len(rc.delivered)-rc.cursor >= n {
			out := append([]request(nil), rc.delivered[rc.cursor:rc.cursor+n]...)
			rc.cursor += n
			rc.mu.Unlock()
			return out, nil
		}
		have, ch := len(rc.delivered)-rc.cursor, rc.notify
		rc.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("receiver: %d of %d messages arrived: %w", have, n, ctx.Err())
		}
	}
}

func (rc *receiver) setBroken(b bool) {
	rc.mu.Lock()
	rc.broken = b
	rc.mu.Unlock()
}

// restart closes the server (dropping every connection) and starts a new
// one on the same address.
func (rc *receiver) restart() error {
	rc.stop()
	return rc.start()
}

// stop closes the server, dropping every connection: its address refuses
// connections until start.
func (rc *receiver) stop() {
	rc.mu.Lock()
	old := rc.srv
	rc.stopped = true
	rc.mu.Unlock()
	old.Close()
}

// start serves again on the address after stop; it does nothing when the
// server runs.
func (rc *receiver) start() error {
	rc.mu.Lock()
	stopped := rc.stopped
	rc.mu.Unlock()
	if !stopped {
		return nil
	}
	var ln net.Listener
	var err error
	// The port was just released; another process can in principle grab
	// it, so retry briefly on a polling deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	testkit.Poll(ctx, 20*time.Millisecond, func() bool {
		ln, err = net.Listen("tcp", rc.addr)
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("receiver: listen again on %s: %w", rc.addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	rc.mu.Lock()
	rc.srv, rc.stopped = srv, false
	rc.mu.Unlock()
	return nil
}

func (rc *receiver) violations() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.overlaps...)
}

func (rc *receiver) maxInFlight() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.maxInFl
}

// verifySignature is a receiver-side Standard Webhooks verifier written
// from the specification, independently of the sink's signer: it accepts
// the request when any v1 signature in webhook-signature matches
// HMAC-SHA256(key, id "." timestamp "." body) and the timestamp is within
// tolerance of now.
func verifySignature(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return fmt.Errorf("bad secret: %w", err)
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("timestamp %s off by %s", ts, d)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		ver, b64, ok := strings.Cut(s, ",")
		if !ok || ver != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no signature matches")
}

// signatureTolerance is how far webhook-timestamp may be from the
// receiver's clock, as a Standard Webhooks receiver would allow.
const signatureTolerance = 5 * time.Minute

var timeNow = time.Now

// newSink builds a sink from cfg and closes it when the test ends.
func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Close(ctx))
	})
	return s
}

// unescape decodes an outbox-topic or outbox-key header.
func unescape(t *testing.T, v string) string {
	t.Helper()
	s, err := url.PathUnescape(v)
	require.NoError(t, err)
	return s
}
