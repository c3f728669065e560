package sinks

import (
	"context"
	"sync"
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
