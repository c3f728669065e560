package sinks

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Inflight tracks the Sends in progress so that a sink's Close can refuse
// new ones (ErrClosed) and wait for the rest, as the Sink contract asks.
// The zero value is ready; it must not be copied after first use.
type Inflight struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Enter registers a Send. It returns false once Close was called; a true
// result must be paired with Leave.
func (f *Inflight) Enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
	return true
}

// Leave ends a Send registered by Enter.
func (f *Inflight) Leave() { f.wg.Done() }

// Close refuses new Sends and waits for those in progress, or for ctx to
// end (then it returns ctx's error and the Sends keep running: the caller
// must make them stop). It may be called more than once.
func (f *Inflight) Close(ctx context.Context) error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	return Wait(ctx, &f.wg)
}

// Shut is Close for a sink's Close: its error, when ctx ended first,
// says so after errPrefix ("outbox: sqs").
func (f *Inflight) Shut(ctx context.Context, errPrefix string) error {
	if err := f.Close(ctx); err != nil {
		return fmt.Errorf("%s: close: in-flight sends still running: %w", errPrefix, err)
	}
	return nil
}

// Wait waits for wg, or for ctx to end, whichever comes first; it returns
// ctx's error in the second case.
func Wait(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DefaultSendTimeout bounds a Send whose sink has no timeout of its own
// and whose caller set no deadline (see Guard).
const DefaultSendTimeout = 30 * time.Second

// Guard is how a sink's Send starts: it refuses the Send with ErrClosed
// once Close was called, returns nil for an empty batch, and returns
// ctx's error, prefixed with errPrefix ("outbox: kafka: send"), when ctx
// has already ended. Otherwise it calls send, counted as in flight until
// it returns.
func (f *Inflight) Guard(ctx context.Context, msgs []Message, errPrefix string, send func(context.Context, []Message) error) error {
	if !f.Enter() {
		return ErrClosed
	}
	defer f.Leave()
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", errPrefix, err)
	}
	return send(ctx, msgs)
}

// GuardTimed is Guard for a sink with a publish timeout: send gets ctx
// bounded as SendContext says.
func (f *Inflight) GuardTimed(ctx context.Context, msgs []Message, errPrefix string, timeout time.Duration, send func(context.Context, []Message) error) error {
	return f.Guard(ctx, msgs, errPrefix, func(ctx context.Context, msgs []Message) error {
		ctx, cancel := SendContext(ctx, timeout)
		defer cancel()
		return send(ctx, msgs)
	})
}

// SendContext bounds one Send: by timeout (a sink's publish_timeout) when
// it is positive, inside whatever deadline ctx already has (the relay's
// --publish-timeout); when timeout is zero, by ctx's own deadline alone,
// or by DefaultSendTimeout when ctx has none.
func SendContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		if _, ok := ctx.Deadline(); ok {
			return context.WithCancel(ctx)
		}
		timeout = DefaultSendTimeout
	}
	return context.WithTimeout(ctx, timeout)
}
