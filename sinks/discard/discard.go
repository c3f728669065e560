// Package discard is a sink that accepts every message and drops it. It
// exists for benchmarks: draining the outbox into it measures the relay's
// own cost (claim, dispatch, delete) with no backend in the way. It counts
// what it dropped so a benchmark can check that nothing went missing.
//
// It is not a way to throw events away in production: every message sent
// to it is deleted from the outbox and lost.
package discard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Config configures the discard sink. It has no options.
type Config struct{}

// ParseURL accepts exactly "discard", "discard:" or "discard://"; anything
// else (a host, path, query parameter, ...) is an error so that a typo is
// not silently ignored.
func ParseURL(raw string) (Config, error) {
	if raw == "discard" {
		return Config{}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the raw URL
		}
		return Config{}, fmt.Errorf("outbox: discard: invalid sink URL: %w", err)
	}
	if u.Scheme != "discard" {
		return Config{}, fmt.Errorf("outbox: discard: sink URL scheme is %q, want \"discard\"", u.Scheme)
	}
	for name := range u.Query() {
		return Config{}, fmt.Errorf("outbox: discard: unknown URL parameter %q (the discard sink has no options)", name)
	}
	if u.User != nil || u.Host != "" || u.Opaque != "" || u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return Config{}, errors.New(`outbox: discard: sink URL takes nothing after the scheme; use "discard://"`)
	}
	return Config{}, nil
}

// Validate reports configuration errors; there are none to report.
func (c Config) Validate() error { return nil }

// Redacted returns the sink URL for logs.
func (c Config) Redacted() string { return "discard://" }

// Sink drops messages and counts them. It is safe for concurrent use.
type Sink struct {
	// mu is held for reading by Send and for writing by Close, so that
	// Close returns only after in-flight Sends have counted, as the
	// sinks.Sink contract asks. Benchmarks read the counters after Close.
	mu       sync.RWMutex
	closed   bool
	messages atomic.Int64
	bytes    atomic.Int64
}

var _ sinks.Sink = (*Sink)(nil)

// New returns a discard sink. The logger is unused; the parameter keeps the
// constructor the same shape as every other sink's.
func New(cfg Config, _ *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Sink{}, nil
}

// Send counts msgs and drops them. Like every sink it fails on a cancelled
// context, so that the relay's cancellation paths behave the same in
// benchmarks as in production.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: discard: send: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return fmt.Errorf("outbox: discard: send: %w", sinks.ErrClosed)
	}
	var n int64
	for i := range msgs {
		n += int64(len(msgs[i].Payload))
	}
	s.messages.Add(int64(len(msgs)))
	s.bytes.Add(n)
	return nil
}

// Close marks the sink closed. It is idempotent.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

// Messages returns how many messages were accepted.
func (s *Sink) Messages() int64 { return s.messages.Load() }

// Bytes returns the total payload size of the accepted messages.
func (s *Sink) Bytes() int64 { return s.bytes.Load() }
