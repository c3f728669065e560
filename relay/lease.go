package relay

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// numLanes is how many lanes a route has.
const numLanes = store.NumLanes

// leaser keeps this relay registered and owning its fair share of lanes.
// It holds one connection for its whole life: the server-side identity of
// that connection (pid, start time) is how other relays tell that this one
// died without waiting for the lease to expire.
type leaser struct {
	r          *Relay
	held       *pgxpool.Conn // conn's pool handle (see dropConn)
	conn       *pgx.Conn
	owned      int
	lanesReady bool
	gaveUp     bool // the lanes were handed back for want of connections
	// unworkedSince is when this relay's heartbeats began to see lanes of
	// its route that no live relay works (zero: all worked); warned is
	// when that was last logged.
	unworkedSince, warned time.Time
}

func newLeaser(r *Relay) *leaser { return &leaser{r: r} }

func (l *leaser) run(ctx context.Context) {
	// Ready allows the first heartbeat a lease TTL.
	l.r.leaseOK.Store(time.Now().UnixNano())
	bo := newReconnectBackoff()
	t := time.NewTicker(l.r.cfg.Heartbeat)
	defer t.Stop()
	for {
		if err := l.tick(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			l.r.log.Warn("lane lease heartbeat failed", "error", err)
			l.closeConn(ctx)
			sleep(ctx, bo.NextBackOff())
			continue
		}
		l.r.leaseOK.Store(time.Now().UnixNano())
		bo.Reset()
		select {
		case <-ctx.Done():
		case <-t.C:
			continue
		}
		break
	}
}

func (l *leaser) closeConn(ctx context.Context) {
	if l.held != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		dropConn(cctx, l.held)
		cancel()
		l.held, l.conn = nil, nil
	}
}

// tick registers the heartbeat, reaps dead relays, renews this relay's
// lanes and moves it towards its fair share.
func (l *leaser) tick(ctx context.Context) error {
	if l.conn == nil {
		pc, err := l.r.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		l.held, l.conn = pc, pc.Conn()
	}
	if d, starved := l.r.starved(); starved {
		return l.giveUp(ctx, d)
	}
	if !l.lanesReady {
		if _, err := l.r.leases.EnsureLanes(ctx, l.conn); err != nil {
			return fmt.Errorf("create lanes of route %q: %w", l.r.cfg.Route, err)
		}
		l.lanesReady = true
	}
	var s share
	err := pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) (err error) {
		s, err = l.heartbeat(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	if l.gaveUp {
		l.gaveUp = false
		l.r.log.Info("workers have database connections again; taking a share of the lanes")
	}
	l.noteUnworked(numLanes - s.worked)
	if s.owned != l.owned {
		l.r.log.Info("lanes rebalanced", "owned", s.owned, "was", l.owned)
		if s.owned > l.owned {
			l.r.wakeAll()
		}
	}
	l.owned = s.owned
	l.r.handover.Store(&s.handover)
	l.r.ownedLane.Store(int64(s.owned))
	l.r.cfg.Hooks.Lanes(s.owned)
	return nil
}

// share is what a heartbeat leaves this relay with: the lanes it owns,
// those it is handing over (a claim was using them), and how many lanes
// of the route a live relay works.
type share struct {
	owned, worked int
	handover      []int16
}

// heartbeat is a tick's transaction: register this relay, reap dead
// ones, renew this relay's leases, then take or hand over lanes towards
// its fair share.
func (l *leaser) heartbeat(ctx context.Context, tx pgx.Tx) (share, error) {
	cfg, q := l.r.cfg, l.r.leases
	var s share
	host, _ := os.Hostname()
	hb := store.Heartbeat{Hostname: host, PID: os.Getpid(), Version: cfg.Version, InFlight: l.r.inFlight.Load()}
	if err := q.Heartbeat(ctx, tx, hb); err != nil {
		return s, fmt.Errorf("heartbeat: %w", err)
	}
	if err := q.ClampHeartbeats(ctx, tx); err != nil {
		return s, fmt.Errorf("bound heartbeats: %w", err)
	}
	if err := q.Reap(ctx, tx, cfg.LeaseTTL, !cfg.DisableFastFailover); err != nil {
		return s, fmt.Errorf("reap: %w", err)
	}
	mine, err := q.Renew(ctx, tx, cfg.LeaseTTL)
	if err != nil {
		return s, fmt.Errorf("renew: %w", err)
	}
	count, err := q.CountRelays(ctx, tx)
	if err != nil {
		return s, fmt.Errorf("count relays: %w", err)
	}
	if count.Lanes < numLanes {
		// Lane rows were deleted under the running relays: the messages
		// of those lanes would wait forever. The insert is idempotent;
		// the count above keeps it off the usual heartbeat.
		n, err := q.EnsureLanes(ctx, tx)
		if err != nil {
			return s, fmt.Errorf("recreate lanes of route %q: %w", cfg.Route, err)
		}
		if n > 0 {
			l.r.log.Warn("lane rows were missing from the lanes table; created them again", "created", n)
		}
	}
	if s.owned, s.handover, err = l.rebalance(ctx, tx, mine, fairShare(count)); err != nil {
		return s, err
	}
	if s.worked, err = q.WorkedLanes(ctx, tx); err != nil {
		return s, fmt.Errorf("count worked lanes: %w", err)
	}
	return s, nil
}

// fairShare is how many lanes this relay should own: an equal part, the
// remainder going to the relays with the smallest ids.
func fairShare(c store.RelayCount) int {
	alive := max(c.Alive, 1)
	target := numLanes / alive
	if c.Rank < numLanes%alive {
		target++
	}
	return target
}

// rebalance acquires lanes, or hands over the highest of mine, until this
// relay owns target lanes. It returns how many it owns and the lanes it is
// still handing over.
func (l *leaser) rebalance(ctx context.Context, tx pgx.Tx, mine []int16, target int) (int, []int16, error) {
	q, owned := l.r.leases, len(mine)
	switch {
	case owned < target:
		got, err := q.Acquire(ctx, tx, l.r.cfg.LeaseTTL, target-owned)
		if err != nil {
			return 0, nil, fmt.Errorf("acquire: %w", err)
		}
		return owned + len(got), nil, nil
	case owned > target:
		// Hand over the highest lanes. Those a claim is using right now
		// are skipped here; the workers stop claiming from them (see
		// Relay.handover) so that the next heartbeat can release them.
		sort.Slice(mine, func(i, j int) bool { return mine[i] > mine[j] })
		giving := mine[:owned-target]
		gone, err := q.Release(ctx, tx, giving)
		if err != nil {
			return 0, nil, fmt.Errorf("release: %w", err)
		}
		return owned - len(gone), without(giving, gone), nil
	}
	return owned, nil, nil
}

// noteUnworked tracks the lanes of this relay's route that no live relay
// works (no lease, an expired one, an owner gone from the relays table, or
// a missing lane row), as seen at this heartbeat. For a moment that is
// normal: a relay died or handed lanes over, and the others take them at
// their next heartbeat. For longer than a lease TTL it is not (their
// messages wait): it is logged, counted by UnworkedLanes and reported to
// hooks implementing LaneHealthHooks.
func (l *leaser) noteUnworked(n int) {
	now := time.Now()
	stuck := 0
	switch {
	case n <= 0:
		if !l.warned.IsZero() {
			l.r.log.Info("every lane of the route is worked again")
		}
		l.unworkedSince, l.warned = time.Time{}, time.Time{}
	case l.unworkedSince.IsZero():
		l.unworkedSince = now
	case now.Sub(l.unworkedSince) > l.r.cfg.LeaseTTL:
		stuck = n
		if now.Sub(l.warned) >= time.Minute {
			l.r.log.Warn("lanes of the route have been worked by no live relay for longer than the lease TTL; their messages wait",
				"unworked_lanes", n, "since", now.Sub(l.unworkedSince).Round(time.Second).String())
			l.warned = now
		}
	}
	l.r.unworked.Store(int64(stuck))
	if h, ok := l.r.cfg.Hooks.(LaneHealthHooks); ok {
		h.UnworkedLanes(stuck)
	}
}

// UnworkedLanes returns how many lanes of the relay's route no live relay
// has worked for longer than a lease TTL, as of its last heartbeat (0
// when every lane is worked, or only briefly was not).
func (r *Relay) UnworkedLanes() int { return int(r.unworked.Load()) }

// leaseHealthy reports an error when the lease heartbeat has not succeeded
// for longer than a lease TTL: this relay's lanes have expired, and it
// works nothing.
func (r *Relay) leaseHealthy() error {
	last := r.leaseOK.Load()
	if last == 0 {
		return nil // Run has not started the leaser yet
	}
	if age := time.Since(time.Unix(0, last)); age > r.cfg.LeaseTTL {
		return fmt.Errorf("outbox: lane lease not renewed for %s (lease TTL %s): this relay holds no lanes", age.Round(time.Second), r.cfg.LeaseTTL)
	}
	return nil
}

// releaseAll hands every lane back and unregisters, so other relays take
// over at their next heartbeat instead of after the lease TTL.
func (l *leaser) releaseAll(ctx context.Context) {
	defer l.closeConn(ctx)
	if l.conn != nil && l.conn.IsClosed() {
		// A heartbeat cancelled by the shutdown closed it.
		l.closeConn(ctx)
	}
	if l.conn == nil {
		pc, err := l.r.pool.Acquire(ctx)
		if err != nil {
			l.r.log.Warn("could not release lanes; they expire after the lease TTL", "error", err)
			return
		}
		l.held, l.conn = pc, pc.Conn()
	}
	if err := l.r.leases.ReleaseAll(ctx, l.conn); err != nil {
		l.r.log.Warn("could not release lanes; they expire after the lease TTL", "error", err)
	}
	if err := l.r.leases.Unregister(ctx, l.conn); err != nil {
		l.r.log.Warn("could not unregister relay", "error", err)
	}
	l.r.ownedLane.Store(0)
}

// giveUp is the heartbeat of a relay whose workers have had no database
// connection for longer than the lease TTL (waited for d): it cannot work
// its lanes, so it hands them back and unregisters, and the other relays,
// counting one relay fewer, take them at their next heartbeat, as they
// would a dead relay's. Lanes a claim is using right now are skipped (a
// worker that still has a connection finishes its batch) and go at a
// later heartbeat; meanwhile the workers stop claiming from them. The
// relay registers and takes its share again at the first heartbeat after
// every worker has a connection.
func (l *leaser) giveUp(ctx context.Context, d time.Duration) error {
	q := l.r.leases
	var left []int16
	err := pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) error {
		mine, err := q.Owned(ctx, tx)
		if err != nil {
			return fmt.Errorf("owned lanes: %w", err)
		}
		gone, err := q.Release(ctx, tx, mine)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		left = without(mine, gone)
		if err := q.Unregister(ctx, tx); err != nil {
			return fmt.Errorf("unregister: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !l.gaveUp {
		l.gaveUp = true
		l.r.log.Warn("workers cannot get a database connection; handing lanes to other relays",
			"waited", d.Round(time.Millisecond), "lanes", l.owned)
	}
	l.owned = len(left)
	l.r.handover.Store(&left)
	l.r.ownedLane.Store(int64(len(left)))
	l.r.cfg.Hooks.Lanes(len(left))
	return nil
}

// without returns xs minus the elements of drop.
func without(xs, drop []int16) []int16 {
	out := make([]int16, 0, len(xs))
	for _, x := range xs {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}
