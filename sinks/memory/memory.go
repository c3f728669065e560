// Package memory is an in-process sink that records what it delivers. The
// relay's tests, the chaos test and the benchmarks use it; it is also the
// reference implementation of the sinks.Sink contract. It is not meant for
// production traffic.
package memory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Sink keeps delivered messages in memory.
type Sink struct {
	mu         sync.Mutex
	cond       *sync.Cond
	closed     bool
	delivered  []sinks.Message
	attempts   int
	sends      int
	fail       func(m sinks.Message) error
	delay      time.Duration
	inFlight   map[string]bool // keys currently being sent
	violations []string
	wg         sync.WaitGroup
}

// New returns an empty sink.
func New() *Sink {
	s := &Sink{inFlight: map[string]bool{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// SetFail installs f, called for each message before it is delivered; a
// non-nil error fails that message. Later messages with the same key in the
// same batch are then reported as not attempted. Pass nil to deliver all.
func (s *Sink) SetFail(f func(m sinks.Message) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

// SetDelay makes every Send take at least d (a slow backend).
func (s *Sink) SetDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// Send implements sinks.Sink.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sinks.ErrClosed
	}
	s.wg.Add(1)
	defer s.wg.Done()
	s.sends++
	fail, delay := s.fail, s.delay
	// Detect two concurrent Sends carrying the same key: the relay must
	// never do that.
	var mine []string
	for _, m := range msgs {
		if m.Key == "" {
			continue
		}
		if s.inFlight[m.Key] {
			if !contains(mine, m.Key) {
				s.violations = append(s.violations, fmt.Sprintf("key %q sent concurrently (seq %d)", m.Key, m.Seq))
			}
			continue
		}
		s.inFlight[m.Key] = true
		mine = append(mine, m.Key)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, k := range mine {
			delete(s.inFlight, k)
		}
		s.mu.Unlock()
	}()

	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	be := sinks.NewBatchError(len(msgs))
	var gate sinks.KeyGate
	for i, m := range msgs {
		if gate.Blocked(m) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		s.mu.Lock()
		s.attempts++
		s.mu.Unlock()
		if fail != nil {
			if err := fail(m); err != nil {
				be.Errs[i] = err
				gate.Fail(m)
				continue
			}
		}
		s.mu.Lock()
		m.Headers = copyHeaders(m.Headers)
		m.Payload = append([]byte(nil), m.Payload...)
		s.delivered = append(s.delivered, m)
		s.cond.Broadcast()
		s.mu.Unlock()
	}
	return be.Err()
}

// Close implements sinks.Sink. It waits for in-flight Sends.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Delivered returns a copy of every delivered message, in delivery order.
func (s *Sink) Delivered() []sinks.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinks.Message(nil), s.delivered...)
}

// Len returns how many messages were delivered.
func (s *Sink) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.delivered)
}

// Attempts returns how many per-message delivery attempts were made.
func (s *Sink) Attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts
}

// Sends returns how many times Send was called.
func (s *Sink) Sends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sends
}

// Violations lists breaches of the relay's contract seen so far (the same
// key in two concurrent Sends).
func (s *Sink) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// WaitFor blocks until at least n messages were delivered or ctx ends.
func (s *Sink) WaitFor(ctx context.Context, n int) error {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.delivered) < n {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memory sink: %d of %d messages delivered: %w", len(s.delivered), n, err)
		}
		s.cond.Wait()
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func copyHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	c := make(map[string]string, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}
