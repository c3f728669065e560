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
	r     *Relay
	held  *pgxpool.Conn // conn's pool handle (see dropConn)
	conn  *pgx.Conn
	owned int
	// joined: this relay registered and told the others (once; again
	// after it gave up).
	joined bool
	gaveUp bool // the lanes were handed back for want of connections
	// unworkedSince is when this relay's heartbeats began to see lanes of
	// its route that no live relay works (zero: all worked); warned is
	// when that was last logged.
	unworkedSince, warned time.Time
	// When the relay last logged that it refuses the route's lanes, that
	// configurations coexist, or that some are unknown (see judgeOthers).
	conflictWarned, coexistWarned, unknownWarned time.Time
}

func newLeaser(r *Relay) *leaser { return &leaser{r: r} }

// rebalanceGap is the least time between two heartbeats that a
// membership notification (or a lane handover) brings forward: a burst of
// notifications (sixteen relays starting together) costs a heartbeat at
// once and at most one more after the gap, not one each.
const rebalanceGap = 50 * time.Millisecond

// shortGap is rebalanceGap for a relay below its fair share: the lanes it
// waits for are handed back one relay at a time.
const shortGap = 10 * time.Millisecond

// handoverRetry is how soon a heartbeat comes again while lanes wait to
// be handed over, should no worker say that its batch ended.
const handoverRetry = 100 * time.Millisecond

func (l *leaser) run(ctx context.Context) {
	// Ready allows the first heartbeat a lease TTL.
	l.r.leaseOK.Store(time.Now().UnixNano())
	bo := newReconnectBackoff()
	t := time.NewTicker(l.r.cfg.Heartbeat)
	defer t.Stop()
	for {
		if err := l.tick(ctx); err != nil {
			if ctx.Err() != nil {
				// A heartbeat cut short may have left its transaction
				// open: closing ends it (releaseAll reconnects).
				l.closeConn(ctx)
				break
			}
			l.r.log.Warn("lane lease heartbeat failed", "error", err)
			l.r.cfg.sig.emit(sigLeaseLost, 0)
			l.closeConn(ctx)
			// It may have been reaped meanwhile: it registers, and says
			// so, again.
			l.joined = false
			sleep(ctx, bo.NextBackOff())
			continue
		}
		l.r.leaseOK.Store(time.Now().UnixNano())
		l.r.cfg.sig.emit(sigLeaseHeld, l.owned)
		last := time.Now()
		bo.Reset()
		if !l.wait(ctx, t.C, last) {
			break
		}
	}
	l.leaveEarly(ctx)
}

// wait waits for the next heartbeat: the ticker's, or an earlier one when
// relays joined or left (MembersChanged) or lanes wait to be handed over.
// It returns false when ctx ended.
func (l *leaser) wait(ctx context.Context, tick <-chan time.Time, last time.Time) bool {
	var retry <-chan time.Time
	if len(l.handingOver()) > 0 {
		tm := time.NewTimer(handoverRetry)
		defer tm.Stop()
		retry = tm.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-tick:
	case <-retry:
	case <-l.r.rebalance:
		gap := rebalanceGap
		if l.r.short.Load() {
			// Below its share, it takes lanes as they are handed back
			// (only such a relay answers those notifications).
			gap = shortGap
		}
		if d := gap - time.Since(last); d > 0 {
			sleep(ctx, d)
		}
		select { // notifications that came meanwhile are served too
		case <-l.r.rebalance:
		default:
		}
	}
	return ctx.Err() == nil
}

// handingOver returns the lanes this relay is handing over.
func (l *leaser) handingOver() []int16 {
	if h := l.r.handover.Load(); h != nil {
		return *h
	}
	return nil
}

// MembersChanged tells the relay that relays of its schema joined, left or
// handed lanes back: it recomputes its share of the lanes now (within
// ~50ms) rather than at its next heartbeat. The relay's own LISTEN calls
// it; a caller running a shared Listen passes it there (see Listen).
func (r *Relay) MembersChanged() {
	select {
	case r.rebalance <- struct{}{}:
	default:
	}
}

// membersNotified handles a membership notification: every relay
// rebalances when relays came or went, and only one below its share
// when lanes were handed back (freed).
func (r *Relay) membersNotified(freed bool) {
	ask := !freed || r.short.Load()
	if ask {
		r.MembersChanged()
	}
	v := 0
	if freed {
		v |= heardFreed
	}
	if ask {
		v |= heardAsked
	}
	r.cfg.sig.emit(sigMembersHeard, v)
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
	if !l.joined {
		// Before it registers, so that the relays of the route do not
		// even count it in their shares: a relay that will take no lane
		// must not make them hand lanes over.
		others, err := l.r.leases.OtherConfigs(ctx, l.conn, l.r.confHash, l.r.cfg.LeaseTTL)
		if err != nil {
			return fmt.Errorf("read the route's configurations: %w", err)
		}
		if err := l.judgeOthers(others); err != nil {
			l.refused(err)
			return nil
		}
	}
	s, err := l.heartbeat(ctx)
	if err != nil {
		// run closes the connection, which ends the transaction: no
		// ROLLBACK round trip to wait for (a shutdown must not).
		return err
	}
	if s.refused {
		return nil
	}
	if l.gaveUp {
		l.gaveUp = false
		l.r.log.Info("workers have database connections again; taking a share of the lanes")
	}
	l.noteUnworked(numLanes - s.worked)
	if s.owned != l.owned {
		l.r.log.Info("lanes rebalanced", "owned", s.owned, "was", l.owned)
		if s.owned > l.owned {
			// The lanes it took may hold a backlog that no wake-up named:
			// every worker visits all of its lanes (see pending).
			l.r.wakeAll()
		}
	}
	changed := s.owned != l.owned
	l.owned = s.owned
	l.r.handover.Store(&s.handover)
	l.r.ownedLane.Store(int64(s.owned))
	l.r.cfg.Hooks.Lanes(s.owned)
	if changed {
		l.r.cfg.sig.emit(sigRebalanced, s.owned)
	}
	if s.owned == s.target && len(s.handover) == 0 {
		l.r.cfg.sig.emit(sigBalanced, s.owned)
	}
	return nil
}

// share is what a heartbeat leaves this relay with: the lanes it owns,
// those it is handing over (a claim was using them), and how many lanes
// of the route a live relay works.
type share struct {
	owned, worked int
	target        int // the fair share
	handover      []int16
	// refused: live relays of the route registered earlier run another
	// configuration; this relay handed its lanes back and unregistered.
	refused bool
}

// heartbeat is a tick's transaction, in three round trips: register
// this relay, reap dead ones, renew this relay's leases and count the
// relays; then take or hand over lanes towards its fair share; then count
// the worked lanes, tell the others if lanes were freed, and commit.
func (l *leaser) heartbeat(ctx context.Context) (share, error) {
	cfg, q, conn := l.r.cfg, l.r.leases, l.conn
	var s share
	var beat store.Beat
	b := &pgx.Batch{}
	joining := !l.joined
	if joining {
		// Register and tell the others before taking any lane, in a
		// transaction of its own that commits before the heartbeat's
		// begins: relays that start together then count each other, and
		// each takes its share rather than everything. The lane rows are
		// created first if some are missing. Sent in the heartbeat's
		// first round trip: on a busy database each round trip of a
		// starting relay waited tens of milliseconds for it.
		b.Queue(store.Begin)
		q.QueueEnsureMissingLanes(b)
		q.QueueHeartbeat(b, l.registration())
		q.QueueNotifyMembers(b)
		b.Queue("COMMIT")
	}
	b.Queue(store.Begin)
	q.QueueBeat(b, l.registration(), cfg.LeaseTTL, !cfg.DisableFastFailover, &beat)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// run closes the connection, which ends the transaction.
		if joining {
			return s, fmt.Errorf("register, heartbeat: %w", err)
		}
		return s, fmt.Errorf("heartbeat: %w", err)
	}
	l.joined = true
	if err := l.judgeOthers(beat.Others); err != nil {
		// It registered at the same moment as relays of another
		// configuration and came second: it hands back what it took and
		// unregisters, in the heartbeat's transaction.
		l.r.setOwned(nil, false)
		b := &pgx.Batch{}
		q.QueueRelease(b, allLanes)
		q.QueueUnregister(b)
		q.QueueNotifyMembers(b)
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return s, fmt.Errorf("hand lanes back to the route's relays of another configuration: %w", err)
		}
		l.joined = false
		l.refused(err)
		s.refused = true
		return s, nil
	}
	l.r.setOwned(beat.Mine, false)
	if beat.Count.Lanes < numLanes {
		// Lane rows were deleted under the running relays: the messages
		// of those lanes would wait forever. The insert is idempotent;
		// the count above keeps it off the usual heartbeat.
		n, err := q.EnsureLanes(ctx, conn)
		if err != nil {
			return s, fmt.Errorf("recreate lanes of route %q: %w", cfg.Route, err)
		}
		if n > 0 {
			l.r.log.Warn("lane rows were missing from the lanes table; created them again", "created", n)
		}
	}
	var err error
	target := fairShare(beat.Count)
	s.target = target
	if s.owned, s.handover, err = l.rebalance(ctx, conn, beat.Mine, target); err != nil {
		return s, err
	}
	l.r.short.Store(s.owned < target)
	b = &pgx.Batch{}
	q.QueueWorkedLanes(b, &s.worked)
	switch {
	case beat.Reaped > 0:
		// A dead relay's lanes are free, and every share changed: the
		// others rebalance now rather than at their next heartbeat.
		q.QueueNotifyMembers(b)
	case s.owned < len(beat.Mine):
		// Lanes handed back: the relays below their share take them now.
		q.QueueNotifyFreed(b)
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return s, fmt.Errorf("count worked lanes, commit: %w", err)
	}
	return s, nil
}

// registration is what this relay's heartbeat says about it.
func (l *leaser) registration() store.Heartbeat {
	host, pid := processIdentity()
	return store.Heartbeat{Hostname: host, PID: pid, Version: l.r.cfg.Version, InFlight: l.r.inFlight.Load(), Pooled: l.r.pooled,
		ConfigHash: l.r.confHash, ConfigSummary: l.r.confSummary}
}

// refused records that the relay holds no lane because live relays of
// its route run another configuration (err says which); with
// ConfigChangeFail, Run stops with err.
func (l *leaser) refused(err error) {
	l.owned = 0
	l.r.ownedLane.Store(0)
	l.r.cfg.Hooks.Lanes(0)
	if l.r.cfg.OnConfigChange == ConfigChangeFail && l.r.abort != nil {
		l.r.abort(err)
	}
}

// processIdentity is how the relays table tells this process's relays
// from other processes' (the watcher wakes only the others).
func processIdentity() (hostname string, pid int) {
	hostname, _ = os.Hostname()
	return hostname, os.Getpid()
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
func (l *leaser) rebalance(ctx context.Context, tx store.Querier, mine []int16, target int) (int, []int16, error) {
	q, owned := l.r.leases, len(mine)
	switch {
	case owned < target:
		got, err := q.Acquire(ctx, tx, l.r.cfg.LeaseTTL, target-owned)
		if err != nil {
			return 0, nil, fmt.Errorf("acquire: %w", err)
		}
		l.r.setOwned(got, true)
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
		l.r.dropOwned(gone)
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

// leaveEarly is the drain's first step, as soon as Run's context ends:
// the relay unregisters and hands back every lane no claim is using, and
// tells the others, which take them at once. The lanes of the batches
// still in flight (their owner no longer registered) follow when those
// batches end (releaseAll). The workers claim nothing new meanwhile.
func (l *leaser) leaveEarly(ctx context.Context) {
	if l.conn == nil || l.conn.IsClosed() {
		return // releaseAll reconnects
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	// One round trip: release is given every lane of the route, and
	// takes those of this relay that no claim is using.
	b := &pgx.Batch{}
	b.Queue(store.Begin)
	l.r.leases.QueueUnregister(b)
	l.r.leases.QueueRelease(b, allLanes)
	l.r.leases.QueueNotifyMembers(b)
	b.Queue("COMMIT")
	if err := l.conn.SendBatch(ctx, b).Close(); err != nil {
		l.closeConn(ctx) // ends the transaction; releaseAll reconnects
		l.r.log.Warn("could not hand lanes over at the start of the drain; they go when it ends", "error", err)
	}
}

// allLanes are the numbers of every lane of a route.
var allLanes = func() []int16 {
	all := make([]int16, numLanes)
	for i := range all {
		all[i] = int16(i)
	}
	return all
}()

// releaseAll hands every lane back and unregisters, and tells the other
// relays, which take the lanes over at once instead of after the lease
// TTL.
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
	q := l.r.leases
	err := pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) error {
		if err := q.ReleaseAll(ctx, tx); err != nil {
			return fmt.Errorf("release lanes: %w", err)
		}
		if err := q.Unregister(ctx, tx); err != nil {
			return fmt.Errorf("unregister: %w", err)
		}
		return q.NotifyMembers(ctx, tx)
	})
	if err != nil {
		l.r.log.Warn("could not release lanes; they expire after the lease TTL", "error", err)
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
		if len(gone) > 0 || !l.gaveUp {
			return q.NotifyMembers(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return err
	}
	l.joined = false // it registers (and says so) again when it can
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
