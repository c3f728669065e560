// Package lease owns a relay's lane lease: the heartbeat that keeps the
// relay registered in its route and owning its fair share of the route's
// lanes, the judgement of the configurations the route's other live
// relays run, and the lane state the rest of the engine reads (the lanes
// held and being handed over, the health of the lease, the lanes no
// relay works). The fingerprint of a configuration is the relay's: the
// leaser is given its hash and summary. The statements are package
// store's.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// Leaser keeps a relay registered and owning its fair share of lanes,
// and owns the lane state the rest of the relay reads: the lanes it holds
// and hands over, whether it is below its share, the health of its lease
// and what it knows of the route's configurations. It holds one
// connection for its whole life: the server-side identity of that
// connection (pid, start time) is how other relays tell that this one
// died without waiting for the lease to expire.
//
// Start runs its heartbeat until the context ends or Stop is called, and
// then hands back the lanes no claim is using; Release hands back the
// rest once the relay's batches have ended.
type Leaser struct {
	service.Loop

	cfg Config
	// cfg's, under the short names the heartbeat uses at every turn.
	q     *store.Leases
	log   *slog.Logger
	hooks Hooks
	sig   *testsig.Bus

	// The lane state, read by the workers, the wake-up and the relay's
	// accessors while run writes it.
	//
	// set: the lanes held at the last heartbeat, so that a wake-up
	// about some lanes wakes only the workers that claim them;
	// ownedLanes: how many.
	set        lanes.Owned
	ownedLanes atomic.Int64
	// handover holds lanes this relay is giving up: workers skip them so
	// that the next heartbeat can release them.
	handover atomic.Pointer[[]int16]
	// short: the last heartbeat left this relay below its fair share
	// (true until the first): a notification that lanes were handed back
	// is for it (see MembersNotified).
	short atomic.Bool
	// rebalance asks for a heartbeat now (see MembersChanged).
	rebalance chan struct{}
	// leaseOK: when the heartbeat last succeeded (unix nanos); unworked:
	// see noteUnworked.
	leaseOK, unworked atomic.Int64
	// waitingConfig is set while this relay takes no lane because live
	// relays of the route run another configuration; routeConfigs counts
	// the configurations (see judgeOthers).
	waitingConfig atomic.Pointer[error]
	routeConfigs  atomic.Int64

	// What Prepare gives run: the sessions go through a
	// transaction-pooling proxy; abort stops the relay with a cause
	// (ConfigFail).
	pooled bool
	abort  func(cause error)

	// run's own state.
	held  *pgxpool.Conn // conn's pool handle (see service.DropConn)
	conn  *pgx.Conn
	owned int
	// joined: this relay registered and told the others (once; again
	// after it gave up).
	joined bool
	gaveUp bool // the lanes were handed back for want of connections
	// shortRetry: the last heartbeat left this relay below its fair share,
	// and the next comes this soon (0: at the ticker's), doubling while it
	// stays short (see took).
	shortRetry time.Duration
	// unworkedSince is when this relay's heartbeats began to see lanes of
	// its route that no live relay works (zero: all worked); warned is
	// when that was last logged.
	unworkedSince, warned time.Time
	// When the relay last logged that it refuses the route's lanes, that
	// configurations coexist, or that some are unknown (see judgeOthers).
	conflictWarned, coexistWarned, unknownWarned time.Time
}

// New returns the leaser of cfg, or an error naming the first field of
// cfg that is missing or out of range. It takes no lane before Start.
func New(cfg Config) (*Leaser, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Leaser{cfg: cfg, q: cfg.Leases, log: cfg.Logger, hooks: cfg.Hooks, sig: cfg.Signals,
		rebalance: make(chan struct{}, 1)}
	l.short.Store(true) // no lanes before the first heartbeat
	return l, nil
}

// Prepare gives the leaser what the relay learns only when it runs: its
// sessions go through a transaction-pooling proxy (pooled: the
// registration names no backend), and abort stops the relay with a cause
// (ConfigFail: the conflict's error). Call it before Start.
func (l *Leaser) Prepare(pooled bool, abort func(cause error)) {
	l.pooled, l.abort = pooled, abort
}

// Start runs the heartbeat in a goroutine of its own until ctx ends or
// Stop is called; it then hands back the lanes no claim is using (see
// leaveEarly). Release hands back the others.
func (l *Leaser) Start(ctx context.Context) error { return l.StartLoop(ctx, l.run) }

// Owned returns the lanes this relay held at the last heartbeat: the
// workers claim from them, and a wake-up about some lanes wakes only the
// workers that claim those.
func (l *Leaser) Owned() *lanes.Owned { return &l.set }

// OwnedCount returns how many lanes this relay holds right now.
func (l *Leaser) OwnedCount() int { return int(l.ownedLanes.Load()) }

// Conflict returns, while this relay takes no lane because live relays
// of its route run another configuration, the error that says so (it
// wraps Config.ErrConflict); nil otherwise.
func (l *Leaser) Conflict() error {
	if err := l.waitingConfig.Load(); err != nil {
		return *err
	}
	return nil
}

// RouteConfigs returns how many configurations the live relays of this
// relay's route ran at its last heartbeat (see Hooks.RouteConfigs); 0
// before the first.
func (l *Leaser) RouteConfigs() int { return int(l.routeConfigs.Load()) }

// UnworkedLanes returns how many lanes of the relay's route no live relay
// has worked for longer than a lease TTL, as of its last heartbeat (0
// when every lane is worked, or only briefly was not).
func (l *Leaser) UnworkedLanes() int { return int(l.unworked.Load()) }

// Summary returns the summary of the route's configuration this relay
// registers (Config.ConfigSummary).
func (l *Leaser) Summary() string { return l.cfg.ConfigSummary }

// rebalanceGap is the least time between two heartbeats that a
// membership notification (or a lane handover) brings forward.
const rebalanceGap = service.NotificationGap

// shortGap is rebalanceGap for a relay below its fair share: the lanes it
// waits for are handed back one relay at a time.
const shortGap = 10 * time.Millisecond

// handoverRetry is how soon a heartbeat comes again while lanes wait to
// be handed over, should no worker say that its batch ended.
const handoverRetry = 100 * time.Millisecond

// run keeps the lease until ctx ends, then hands back the lanes no claim
// is using (see leaveEarly).
func (l *Leaser) run(ctx context.Context) {
	// Healthy allows the first heartbeat a lease TTL.
	l.leaseOK.Store(time.Now().UnixNano())
	bo := service.ReconnectBackoff()
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	for {
		if err := l.tick(ctx); err != nil {
			if ctx.Err() != nil {
				// A heartbeat cut short may have left its transaction
				// open: closing ends it (Release reconnects).
				l.closeConn(ctx)
				break
			}
			l.log.Warn("lane lease heartbeat failed", "error", err)
			l.sig.Emit(testsig.LeaseLost, 0)
			l.closeConn(ctx)
			// It may have been reaped meanwhile: it registers, and says
			// so, again.
			l.joined = false
			service.Sleep(ctx, bo.NextBackOff())
			continue
		}
		l.leaseOK.Store(time.Now().UnixNano())
		l.sig.Emit(testsig.LeaseHeld, l.owned)
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
func (l *Leaser) wait(ctx context.Context, tick <-chan time.Time, last time.Time) bool {
	var retry <-chan time.Time
	if d := l.retryIn(); d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		retry = tm.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-tick:
	case <-retry:
	case <-l.rebalance:
		gap := rebalanceGap
		if l.short.Load() {
			// Below its share, it takes lanes as they are handed back
			// (only such a relay answers those notifications).
			gap = shortGap
		}
		if d := gap - time.Since(last); d > 0 {
			service.Sleep(ctx, d)
		}
		select { // notifications that came meanwhile are served too
		case <-l.rebalance:
		default:
		}
	}
	return ctx.Err() == nil
}

// retryIn is how soon the next heartbeat comes, before the ticker's: while
// lanes wait to be handed over, or while this relay is below its share (0:
// at the ticker's).
func (l *Leaser) retryIn() time.Duration {
	if len(l.HandingOver()) > 0 {
		return handoverRetry
	}
	return l.shortRetry
}

// HandingOver returns the lanes this relay is handing over: the workers
// claim nothing from them, so that a heartbeat can release them once no
// batch holds them (nil when none are).
func (l *Leaser) HandingOver() []int16 {
	if h := l.handover.Load(); h != nil {
		return *h
	}
	return nil
}

// MembersChanged asks for a heartbeat now: relays of the schema joined,
// left or handed lanes back, or a batch that held a lane being handed
// over ended, and the relay recomputes its share of the lanes within
// ~rebalanceGap rather than at its next heartbeat.
func (l *Leaser) MembersChanged() {
	select {
	case l.rebalance <- struct{}{}:
	default:
	}
}

// MembersNotified handles a membership notification (the relay's LISTEN,
// or a Set's shared one for each of its relays): every relay rebalances
// when relays came or went, and only one below its share when lanes were
// handed back (freed).
func (l *Leaser) MembersNotified(freed bool) {
	ask := !freed || l.short.Load()
	if ask {
		l.MembersChanged()
	}
	v := 0
	if freed {
		v |= testsig.HeardFreed
	}
	if ask {
		v |= testsig.HeardAsked
	}
	l.sig.Emit(testsig.MembersHeard, v)
}

// closeConn ends the leaser's use of its connection, which it closes
// (see service.DropConn); connect takes another.
func (l *Leaser) closeConn(ctx context.Context) {
	if l.held != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		service.DropConn(cctx, l.held)
		cancel()
		// service.DropConn closes the socket too: the session, and the
		// transaction of a heartbeat cut short by the shutdown, end at
		// once. Before, pgx over TLS could not send Terminate after a
		// write that timed out and waited 15 s for the server to hang up,
		// while the server kept the heartbeat's transaction open with
		// this relay's row and lanes locked: reaping skipped the row (the
		// relay looked alive, and relays of a new configuration waited
		// for it) and Release gave up after 5 s.
		l.held, l.conn = nil, nil
	}
}

// connect takes the leaser's connection from the pool, unless it has one.
func (l *Leaser) connect(ctx context.Context) error {
	if l.conn != nil {
		return nil
	}
	pc, err := l.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	l.held, l.conn = pc, pc.Conn()
	return nil
}

// tick registers the heartbeat, reaps dead relays, renews this relay's
// lanes and moves it towards its fair share.
func (l *Leaser) tick(ctx context.Context) error {
	if err := l.connect(ctx); err != nil {
		return err
	}
	if d, starved := l.cfg.Starved(); starved {
		return l.giveUp(ctx, d)
	}
	if !l.joined {
		// Before it registers, so that the relays of the route do not
		// even count it in their shares: a relay that will take no lane
		// must not make them hand lanes over.
		others, err := l.q.OtherConfigs(ctx, l.conn, l.cfg.ConfigHash, l.cfg.LeaseTTL, l.cfg.FastFailover)
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
		l.log.Info("workers have database connections again; taking a share of the lanes")
	}
	l.noteUnworked(lanes.N - s.worked)
	l.took(s)
	return nil
}

// took records the share a heartbeat left this relay with.
func (l *Leaser) took(s share) {
	changed := s.owned != l.owned
	if changed {
		l.log.Info("lanes rebalanced", "owned", s.owned, "was", l.owned)
		if s.owned > l.owned {
			// The lanes it took may hold a backlog that no wake-up named:
			// every worker visits all of its lanes (see lanes.Pending).
			l.cfg.WakeAll()
		}
	}
	// A relay below its share takes lanes as they are handed back, told by
	// the notification of the relay that freed them. Two relays below
	// their share that heard it at once may miss a lane between them (the
	// first one's acquire locks the free lanes, the other's skips them),
	// and no further notification comes: the short one looks again soon,
	// then less and less often, until it has its share.
	switch {
	case s.owned >= s.target:
		l.shortRetry = 0
	case l.shortRetry == 0:
		l.shortRetry = handoverRetry
	default:
		l.shortRetry = min(2*l.shortRetry, l.cfg.Heartbeat)
	}
	l.owned = s.owned
	l.handover.Store(&s.handover)
	l.ownedLanes.Store(int64(s.owned))
	l.hooks.Lanes(s.owned)
	if changed {
		l.sig.Emit(testsig.Rebalanced, s.owned)
	}
	if s.owned == s.target && len(s.handover) == 0 {
		l.sig.Emit(testsig.Balanced, s.owned)
	}
}

// share is what a heartbeat leaves this relay with: the lanes it owns (of
// target, its fair share), those it is handing over (a claim was using
// them), and how many lanes of the route a live relay works.
type share struct {
	owned, worked int
	target        int
	handover      []int16
	// refused: live relays of the route registered earlier run another
	// configuration; this relay handed its lanes back and unregistered.
	refused bool
}

// heartbeat is a tick's transaction, in three round trips: register
// this relay, reap dead ones, renew this relay's leases and count the
// relays (beat); then take or hand over lanes towards its fair share
// (rebalance); then count the worked lanes, tell the others if lanes
// were freed, and commit (endBeat).
func (l *Leaser) heartbeat(ctx context.Context) (share, error) {
	var s share
	beat, err := l.beat(ctx)
	if err != nil {
		return s, err
	}
	if err := l.judgeOthers(beat.Others); err != nil {
		// It registered at the same moment as relays of another
		// configuration and came second.
		return share{refused: true}, l.withdraw(ctx, err)
	}
	l.set.Store(beat.Mine, false)
	if err := l.ensureLanes(ctx, beat.Count); err != nil {
		return s, err
	}
	s.target = fairShare(beat.Count)
	if s.owned, s.handover, err = l.rebalanceTo(ctx, l.conn, beat.Mine, s.target); err != nil {
		return s, err
	}
	l.short.Store(s.owned < s.target)
	return s, l.endBeat(ctx, beat, &s)
}

// beat is the heartbeat's first round trip: it registers this relay and
// tells the others (when it has not yet), then begins the heartbeat's
// transaction, renews the leases, reaps dead relays and counts the live
// ones.
func (l *Leaser) beat(ctx context.Context) (store.Beat, error) {
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
		l.q.QueueEnsureMissingLanes(b)
		l.q.QueueHeartbeat(b, l.registration())
		l.q.QueueNotifyMembers(b)
		b.Queue("COMMIT")
	}
	b.Queue(store.Begin)
	l.q.QueueBeat(b, l.registration(), l.cfg.LeaseTTL, l.cfg.FastFailover, &beat)
	if err := l.conn.SendBatch(ctx, b).Close(); err != nil {
		// run closes the connection, which ends the transaction.
		if joining {
			return beat, fmt.Errorf("register, heartbeat: %w", err)
		}
		return beat, fmt.Errorf("heartbeat: %w", err)
	}
	l.joined = true
	return beat, nil
}

// withdraw hands back, in the heartbeat's transaction, what this relay
// took, and unregisters: live relays of the route run another
// configuration (err says which).
func (l *Leaser) withdraw(ctx context.Context, refusal error) error {
	l.set.Store(nil, false)
	b := &pgx.Batch{}
	l.q.QueueRelease(b, lanes.All)
	l.q.QueueUnregister(b)
	l.q.QueueNotifyMembers(b)
	b.Queue("COMMIT")
	if err := l.conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("hand lanes back to the route's relays of another configuration: %w", err)
	}
	l.joined = false
	l.refused(refusal)
	return nil
}

// ensureLanes creates the route's lane rows again when the heartbeat
// counted fewer than lanes.N: lane rows were deleted under the running
// relays, and the messages of those lanes would wait forever. The insert
// is idempotent; the count keeps it off the usual heartbeat.
func (l *Leaser) ensureLanes(ctx context.Context, c store.RelayCount) error {
	if c.Lanes >= lanes.N {
		return nil
	}
	n, err := l.q.EnsureLanes(ctx, l.conn)
	if err != nil {
		return fmt.Errorf("recreate lanes of route %q: %w", l.cfg.Route, err)
	}
	if n > 0 {
		l.log.Warn("lane rows were missing from the lanes table; created them again", "created", n)
	}
	return nil
}

// endBeat is the heartbeat's last round trip: it counts the lanes a live
// relay works, tells the other relays when every share changed (a dead
// relay was reaped) or lanes were handed back, and commits.
func (l *Leaser) endBeat(ctx context.Context, beat store.Beat, s *share) error {
	b := &pgx.Batch{}
	l.q.QueueWorkedLanes(b, &s.worked)
	switch {
	case beat.Reaped > 0:
		// A dead relay's lanes are free, and every share changed: the
		// others rebalance now rather than at their next heartbeat.
		l.q.QueueNotifyMembers(b)
	case s.owned < len(beat.Mine):
		// Lanes handed back: the relays below their share take them now.
		l.q.QueueNotifyFreed(b)
	}
	b.Queue("COMMIT")
	if err := l.conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("count worked lanes, commit: %w", err)
	}
	return nil
}

// registration is what this relay's heartbeat says about it.
func (l *Leaser) registration() store.Heartbeat {
	host, pid := service.ProcessIdentity()
	h := store.Heartbeat{Hostname: host, PID: pid, Version: l.cfg.Version, InFlight: l.cfg.InFlight(), Pooled: l.pooled,
		ConfigHash: l.cfg.ConfigHash, ConfigSummary: l.cfg.ConfigSummary}
	if l.cfg.Report != nil {
		st := l.cfg.Report()
		if !st.DownSince.IsZero() {
			h.DownSince, h.DownCause, h.DownProbes = st.DownSince, downCause(st.DownCause), st.DownProbes
		}
		if !st.LimitedSince.IsZero() {
			h.LimitedSince, h.LimitCause = st.LimitedSince, downCause(st.LimitCause)
		}
		if !st.FailingSince.IsZero() {
			h.FailingSince, h.LastError = st.FailingSince, downCause(st.LastError)
		}
	}
	return h
}

// maxDownCause bounds, in characters, the cause of an outage (and a
// route's limit cause and last error) that the heartbeat records.
const maxDownCause = 500

// downCause is the text of an outage's cause as the relays table keeps
// it: on one line, valid UTF-8 without NUL (Postgres text refuses both),
// at most maxDownCause characters. The sinks redact their errors' URLs
// and secrets.
func downCause(err error) string {
	if err == nil {
		return "unknown"
	}
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == 0 }), " ")
	if r := []rune(s); len(r) > maxDownCause {
		s = string(r[:maxDownCause-1]) + "…"
	}
	return s
}

// refused records that the relay holds no lane because live relays of
// its route run another configuration (err says which); with
// ConfigFail, the relay stops with err.
func (l *Leaser) refused(err error) {
	l.owned = 0
	l.ownedLanes.Store(0)
	l.hooks.Lanes(0)
	if l.cfg.OnConfigChange == ConfigFail && l.abort != nil {
		l.abort(err)
	}
}

// fairShare is how many lanes this relay should own: an equal part, the
// remainder going to the relays with the smallest ids.
func fairShare(c store.RelayCount) int {
	alive := max(c.Alive, 1)
	target := lanes.N / alive
	if c.Rank < lanes.N%alive {
		target++
	}
	return target
}

// rebalanceTo acquires lanes, or hands over the highest of mine, until
// this relay owns target lanes. It returns how many it owns and the lanes
// it is still handing over.
func (l *Leaser) rebalanceTo(ctx context.Context, tx store.Querier, mine []int16, target int) (int, []int16, error) {
	owned := len(mine)
	switch {
	case owned < target:
		got, err := l.q.Acquire(ctx, tx, l.cfg.LeaseTTL, target-owned)
		if err != nil {
			return 0, nil, fmt.Errorf("acquire: %w", err)
		}
		l.set.Store(got, true)
		return owned + len(got), nil, nil
	case owned > target:
		// Hand over the highest lanes. Those a claim is using right now
		// are skipped here; the workers stop claiming from them (see
		// Leaser.HandingOver) so that the next heartbeat can release them.
		sort.Slice(mine, func(i, j int) bool { return mine[i] > mine[j] })
		giving := mine[:owned-target]
		gone, err := l.q.Release(ctx, tx, giving)
		if err != nil {
			return 0, nil, fmt.Errorf("release: %w", err)
		}
		l.set.Drop(gone)
		return owned - len(gone), lanes.Without(giving, gone), nil
	}
	return owned, nil, nil
}

// noteUnworked tracks the lanes of this relay's route that no live relay
// works (no lease, an expired one, an owner gone from the relays table, or
// a missing lane row), as seen at this heartbeat. For a moment that is
// normal: a relay died or handed lanes over, and the others take them at
// their next heartbeat. For longer than a lease TTL it is not (their
// messages wait): it is logged, counted (UnworkedLanes) and reported to
// Hooks.UnworkedLanes.
func (l *Leaser) noteUnworked(n int) {
	now := time.Now()
	stuck := 0
	switch {
	case n <= 0:
		if !l.warned.IsZero() {
			l.log.Info("every lane of the route is worked again")
		}
		l.unworkedSince, l.warned = time.Time{}, time.Time{}
	case l.unworkedSince.IsZero():
		l.unworkedSince = now
	case now.Sub(l.unworkedSince) > l.cfg.LeaseTTL:
		stuck = n
		if now.Sub(l.warned) >= time.Minute {
			l.log.Warn("lanes of the route have been worked by no live relay for longer than the lease TTL; their messages wait",
				"unworked_lanes", n, "since", now.Sub(l.unworkedSince).Round(time.Second).String())
			l.warned = now
		}
	}
	l.unworked.Store(int64(stuck))
	l.hooks.UnworkedLanes(stuck)
}

// LastRenewed is when the lease heartbeat last succeeded (zero before
// the first).
func (l *Leaser) LastRenewed() time.Time {
	if last := l.leaseOK.Load(); last != 0 {
		return time.Unix(0, last)
	}
	return time.Time{}
}

// Healthy reports an error before the first heartbeat has taken lanes
// (or found that the relay must wait: then Conflict says why), and when
// the lease heartbeat has not succeeded for longer than a lease TTL: this
// relay's lanes have expired, and it works nothing.
func (l *Leaser) Healthy() error {
	last := l.leaseOK.Load()
	if last == 0 || (!l.set.Known() && l.waitingConfig.Load() == nil) {
		// Until its first heartbeat has judged the route's other
		// configurations, a relay does not know whether it will take
		// lanes or wait for relays of another configuration to leave:
		// ready meanwhile, it would let an orchestrator remove the
		// relays it is about to wait for.
		return errors.New("outbox: starting: no lane lease heartbeat has ended yet")
	}
	if age := time.Since(time.Unix(0, last)); age > l.cfg.LeaseTTL {
		return fmt.Errorf("outbox: lane lease not renewed for %s (lease TTL %s): this relay holds no lanes", age.Round(time.Second), l.cfg.LeaseTTL)
	}
	return nil
}

// leaveEarly is the drain's first step, as soon as the relay's context
// ends: the relay unregisters and hands back every lane no claim is
// using, and tells the others, which take them at once. The lanes of the
// batches still in flight (their owner no longer registered) follow when
// those batches end (Release). The workers claim nothing new meanwhile.
func (l *Leaser) leaveEarly(ctx context.Context) {
	if l.conn == nil || l.conn.IsClosed() {
		return // Release reconnects
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	// One round trip: release is given every lane of the route, and
	// takes those of this relay that no claim is using.
	b := &pgx.Batch{}
	b.Queue(store.Begin)
	l.q.QueueUnregister(b)
	l.q.QueueRelease(b, lanes.All)
	l.q.QueueNotifyMembers(b)
	b.Queue("COMMIT")
	if err := l.conn.SendBatch(ctx, b).Close(); err != nil {
		l.closeConn(ctx) // ends the transaction; Release reconnects
		l.log.Warn("could not hand lanes over at the start of the drain; they go when it ends", "error", err)
	}
}

// Release hands every lane back and unregisters, and tells the other
// relays, which take the lanes over at once instead of after the lease
// TTL. The relay calls it after Stop, once its batches have ended.
func (l *Leaser) Release(ctx context.Context) {
	defer l.closeConn(ctx)
	if l.conn != nil && l.conn.IsClosed() {
		// A heartbeat cancelled by the shutdown closed it.
		l.closeConn(ctx)
	}
	if err := l.connect(ctx); err != nil {
		l.log.Warn("could not release lanes; they expire after the lease TTL", "error", err)
		return
	}
	q := l.q
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
		l.log.Warn("could not release lanes; they expire after the lease TTL", "error", err)
	}
	l.ownedLanes.Store(0)
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
func (l *Leaser) giveUp(ctx context.Context, d time.Duration) error {
	q := l.q
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
		left = lanes.Without(mine, gone)
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
		l.log.Warn("workers cannot get a database connection; handing lanes to other relays",
			"waited", d.Round(time.Millisecond), "lanes", l.owned)
	}
	l.owned = len(left)
	l.handover.Store(&left)
	l.ownedLanes.Store(int64(len(left)))
	l.hooks.Lanes(len(left))
	return nil
}
