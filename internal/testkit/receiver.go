package testkit

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Receiver is a webhook endpoint on loopback for the HTTP sink: a real
// HTTP server that reads each request, lets a handler decide the answer
// and counts what it accepted. It can be taken down (connections are
// refused) and brought back on the same address.
type Receiver struct {
	handle Handler
	addr   string

	requests atomic.Int64
	accepted atomic.Int64
	// probes counts HEAD requests (the sink's Probe); last is the status
	// of the latest other request on each path; health answers HEAD when
	// set.
	probes atomic.Int64
	health atomic.Pointer[func() int]
	lastMu sync.Mutex
	last   map[string]int

	mu      sync.Mutex
	srv     *http.Server
	served  chan struct{} // closed when srv's Serve returns
	changed chan struct{} // closed and replaced at every accepted request
}

// Request is one request the receiver read. Body is valid only while the
// handler runs.
type Request struct {
	*http.Request
	Body []byte
	// At is when the receiver started reading the request.
	At time.Time
	// Reply holds the answer's headers: a handler may set some (a
	// Retry-After).
	Reply http.Header
}

// Handler decides the answer to a request: a 2xx status counts it as
// accepted and is answered without a body; any other status is answered
// with msg. A nil Handler accepts everything with 204.
type Handler func(r *Request) (status int, msg string)

// NewReceiver starts a receiver on a free loopback port.
func NewReceiver(handle Handler) (*Receiver, error) {
	rc := &Receiver{handle: handle, addr: "127.0.0.1:0", changed: make(chan struct{})}
	if err := rc.Start(); err != nil {
		return nil, err
	}
	return rc, nil
}

// NewTestReceiver is NewReceiver for a test: it fails tb when the receiver
// cannot listen and closes it when the test ends.
func NewTestReceiver(tb testing.TB, handle Handler) *Receiver {
	tb.Helper()
	rc, err := NewReceiver(handle)
	if err != nil {
		tb.Fatalf("receiver: %v", err)
	}
	tb.Cleanup(rc.Stop)
	return rc
}

// URL is the receiver's webhook URL (path /hook).
func (rc *Receiver) URL() string { return rc.Base() + "/hook" }

// Base is the receiver's URL without a path ("http://host:port"): the
// receiver answers on every path.
func (rc *Receiver) Base() string { return "http://" + rc.Addr() }

// Addr is the receiver's host:port.
func (rc *Receiver) Addr() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.addr
}

// Start listens again on the receiver's address after Stop (the first
// time, on a free port). The port was just released, and another process
// can in principle take it, so Start retries for up to five seconds.
func (rc *Receiver) Start() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	Poll(ctx, 50*time.Millisecond, func() bool {
		ln, err = net.Listen("tcp", rc.addr)
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("receiver: listen on %s: %w", rc.addr, err)
	}
	rc.addr = ln.Addr().String()
	rc.srv = &http.Server{Handler: http.HandlerFunc(rc.serve), ReadHeaderTimeout: 10 * time.Second}
	rc.served = make(chan struct{})
	go func(srv *http.Server, served chan struct{}) {
		defer close(served)
		_ = srv.Serve(ln) // ErrServerClosed after Stop
	}(rc.srv, rc.served)
	return nil
}

// Stop closes the listener and every connection: the receiver is down
// until Start. Stopping a stopped receiver does nothing.
func (rc *Receiver) Stop() {
	rc.mu.Lock()
	srv, served := rc.srv, rc.served
	rc.srv = nil
	rc.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		<-served
	}
}

// Requests counts the requests read, accepted or not.
func (rc *Receiver) Requests() int64 { return rc.requests.Load() }

// Accepted counts the requests answered 2xx.
func (rc *Receiver) Accepted() int64 { return rc.accepted.Load() }

// WaitAccepted waits until at least n requests were accepted, or ctx
// ends; it reports whether n were.
func (rc *Receiver) WaitAccepted(ctx context.Context, n int64) bool {
	for {
		rc.mu.Lock()
		changed := rc.changed
		rc.mu.Unlock()
		if rc.accepted.Load() >= n {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return rc.accepted.Load() >= n
		}
	}
}

// SetHealth sets how the receiver answers a HEAD request, the HTTP
// sink's probe of whether a receiver is up (sinks.Prober): with the
// status health returns. Without it, a HEAD is answered like the latest
// other request on its path when that got a 5xx (a receiver that answers
// everything 503 answers its probe 503 too), else 204. HEAD requests do not reach
// the handler and count in Probes only.
func (rc *Receiver) SetHealth(health func() int) { rc.health.Store(&health) }

// Probes counts the HEAD requests read.
func (rc *Receiver) Probes() int64 { return rc.probes.Load() }

// probe answers a HEAD request.
func (rc *Receiver) probe(w http.ResponseWriter, r *http.Request) {
	rc.probes.Add(1)
	status := http.StatusNoContent
	rc.lastMu.Lock()
	last := rc.last[r.URL.Path]
	rc.lastMu.Unlock()
	if h := rc.health.Load(); h != nil && *h != nil {
		status = (*h)()
	} else if last >= 500 {
		status = last
	}
	w.WriteHeader(status)
}

var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		rc.probe(w, r)
		return
	}
	at := time.Now()
	buf := bodies.Get().(*bytes.Buffer)
	defer bodies.Put(buf)
	buf.Reset()
	if _, err := io.Copy(buf, r.Body); err != nil {
		return // the sender went away mid-request; it saw no answer
	}
	rc.requests.Add(1)
	status, msg := http.StatusNoContent, ""
	if rc.handle != nil {
		status, msg = rc.handle(&Request{Request: r, Body: buf.Bytes(), At: at, Reply: w.Header()})
	}
	if w.Header().Get("Outbox-Failure") == "" {
		// An answer that says it is the message's own says nothing of
		// the receiver's health.
		rc.lastMu.Lock()
		if rc.last == nil {
			rc.last = map[string]int{}
		}
		rc.last[r.URL.Path] = status
		rc.lastMu.Unlock()
	}
	if status/100 != 2 {
		http.Error(w, msg, status)
		return
	}
	rc.accepted.Add(1)
	rc.mu.Lock()
	close(rc.changed)
	rc.changed = make(chan struct{})
	rc.mu.Unlock()
	w.WriteHeader(status)
}
