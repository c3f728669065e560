package relay

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

func (r *Relay) wakeAll() {
	for _, c := range r.wake {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Wake makes every worker look for work now (as a notification does).
func (r *Relay) Wake() { r.wakeAll() }

// Listen calls wake on every NOTIFY from writers to schema's outbox (and
// from the fan-out router), until ctx ends. A relay runs it itself unless
// Config.SharedListener is set: a process running several relays (one per
// route) saves a connection per relay by running one Listen that wakes
// them all, as a Set does. Notifications are an optimization: workers poll anyway, so a
// lost connection only costs latency until it is back.
func Listen(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger, wake func()) {
	if log == nil {
		log = slog.Default()
	}
	s, err := store.NewSchema(schema)
	if err != nil {
		log.Error("cannot listen for notifications; polling", "error", err)
		<-ctx.Done()
		return
	}
	bo := newReconnectBackoff()
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			// The connection carries LISTEN state: never give it back to
			// the pool (but keep it counted there, see dropConn).
			defer dropConn(context.WithoutCancel(ctx), conn)
			pc := conn.Conn()
			if err := store.Listen(ctx, pc, s); err != nil {
				return err
			}
			bo.Reset()
			wake() // anything written while we were not listening
			for {
				if _, err := pc.WaitForNotification(ctx); err != nil {
					return err
				}
				wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		log.Warn("listen connection lost; polling until it is back", "error", err, "retry_in", d)
		sleep(ctx, d)
	}
}
