package main

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// receiver is the webhook endpoint the HTTP sink posts to (a
// testkit.Receiver). It answers 200 to everything, counts, checks that
// each key's messages arrive in increasing message number, and can record
// each message's arrival time; the other sinks' consumers record into it
// too.
type receiver struct {
	srv *testkit.Receiver
	URL string

	count atomic.Int64
	// per-key order
	mu         sync.Mutex
	last       map[string]int64
	violations int64
	// arrival times (unix ns) by message number, when recording latency
	arrivals []atomic.Int64
}

func newReceiver() (*receiver, error) {
	r := &receiver{last: map[string]int64{}}
	srv, err := testkit.NewReceiver(func(req *testkit.Request) (int, string) {
		r.record(req.At.UnixNano(), req.Header.Get(wire.Key), req.Body)
		return http.StatusOK, ""
	})
	if err != nil {
		return nil, err
	}
	r.srv, r.URL = srv, srv.URL()
	return r, nil
}

func (r *receiver) close() { r.srv.Stop() }

// reset clears the counters; with capacity > 0 it records arrival times of
// messages numbered 0..capacity-1.
func (r *receiver) reset(capacity int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count.Store(0)
	r.last = map[string]int64{}
	r.violations = 0
	r.arrivals = nil
	if capacity > 0 {
		r.arrivals = make([]atomic.Int64, capacity)
	}
}

// record counts one message received at now (unix ns), from any sink.
func (r *receiver) record(now int64, key string, payload []byte) {
	n := parseN(payload)
	r.mu.Lock()
	if n >= 0 && key != "" {
		if last, ok := r.last[key]; ok && n <= last {
			r.violations++
		}
		r.last[key] = n
	}
	arr := r.arrivals
	r.mu.Unlock()
	if n >= 0 && n < int64(len(arr)) {
		arr[n].CompareAndSwap(0, now)
	}
	r.count.Add(1)
}

// resetOrder forgets counts and per-key order, keeping arrival times.
func (r *receiver) resetOrder() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count.Store(0)
	r.last = map[string]int64{}
	r.violations = 0
}

func (r *receiver) orderViolations() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.violations
}

// waitCount waits until n messages arrived.
func (r *receiver) waitCount(ctx context.Context, n int64, limit time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return testkit.Poll(ctx, 2*time.Millisecond, func() bool { return r.count.Load() >= n })
}

// parseN reads n from a payload that starts with {"n":<digits>; -1 if it
// does not.
func parseN(b []byte) int64 {
	const prefix = `{"n":`
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return -1
	}
	b = b[len(prefix):]
	end := bytes.IndexByte(b, ',')
	if end < 0 {
		return -1
	}
	n, err := strconv.ParseInt(string(b[:end]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}
