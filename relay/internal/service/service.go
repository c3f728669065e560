// Package service gives the engine's long-running components (the lane
// leaser, the wake-up, the archive's upkeep) one shape: Start(ctx) runs
// the component's loop in a goroutine of its own until ctx ends or Stop
// is called; Stop ends it and waits for it. It also holds the small
// helpers those loops share: a context-aware sleep and ticker, the
// reconnect backoff, and the way a long-lived role gives back its
// database connection.
package service

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Service is a component that runs between Start and Stop.
type Service interface {
	// Start runs the component until ctx ends or Stop is called. It
	// returns at once; an error says it could not start (it runs
	// already).
	Start(ctx context.Context) error
	// Stop ends the component and waits for it; after it, nothing of the
	// component runs. Stop before Start, or twice, does nothing.
	Stop()
}

// ErrStarted: Start was called on a component that runs already.
var ErrStarted = errors.New("outbox: component started twice")

// Loop implements Start and Stop for a component whose work is one
// function: embed it, and call StartLoop from Start.
type Loop struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// StartLoop runs run in a goroutine of its own, with a context that ends
// with ctx or at Stop.
func (l *Loop) StartLoop(ctx context.Context, run func(ctx context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		return ErrStarted
	}
	ctx, l.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	l.done = done
	go func() {
		defer close(done)
		run(ctx)
	}()
	return nil
}

// Stop ends the loop's context and waits for run to return.
func (l *Loop) Stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
}

// Sleep waits for d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Every calls f every d until ctx ends (not at once).
func Every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// ReconnectBackoff paces reconnects to the database and the sink after
// infrastructure errors (not message failures): from 100ms, doubling,
// up to 5s, for ever.
func ReconnectBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// DropConn ends a long-lived role's use of a pool connection. A role
// (the lane lease, LISTEN) keeps a pool connection for its whole life
// instead of hijacking it: a hijacked connection leaves the pool's
// count, and the pool would open another in its place, past MaxConns.
// The connection is closed when the role is done with it, never returned
// to the pool, so that no session state (LISTEN) reaches a worker.
//
// The socket is closed too, so that the session (and a transaction a
// cancelled statement left open) ends at once: when the role's context
// ended in the middle of a write, pgx already counts the connection as
// closing and Close does nothing, and over TLS it cannot send Terminate
// and waits up to 15 s for the server to hang up. On a connection
// already closed this does nothing.
func DropConn(ctx context.Context, c *pgxpool.Conn) {
	sock := c.Conn().PgConn().Conn()
	_ = c.Conn().Close(ctx)
	_ = sock.Close()
	c.Release() // destroys it: it is closed
}

// NotificationGap is the least time between two acts that membership
// notifications prompt, in every component that acts on them (the
// leaser's heartbeats, the wake-up's tries of the watcher's lock): a
// burst of notifications (sixteen relays starting together) costs one
// act at once and at most one more after the gap, not one each.
const NotificationGap = 50 * time.Millisecond

// ProcessIdentity is how the relays table tells this process's relays
// from other processes': the leaser registers its relays with it, and the
// watcher wakes only the listeners of other processes.
func ProcessIdentity() (hostname string, pid int) {
	hostname, _ = os.Hostname()
	return hostname, os.Getpid()
}
