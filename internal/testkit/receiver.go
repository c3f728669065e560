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

var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) {
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
