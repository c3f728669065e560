// Package wake owns the engine's wake-up (docs/design.md, "Wake-up"):
// one process's LISTEN session and the NOTIFYs it hears, the election of
// the schema's watcher among every relay process's sessions, and the
// watcher's looks for new rows and for rows that came due, by polling or
// by following the WAL. watch.go is the watcher's state machine and
// wal.go the WAL stream. Wake-ups are an optimization: a lost one costs
// latency up to the relay's PollInterval, never a message.
//
// The workers it wakes are not its own: the relay hands it a Wake
// callback (its workers of some lanes) and a Members one (its leaser's
// view of the relays), and keeps the workers, the lanes they hold and
// the leases in its own packages.
package wake

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// The modes of Config.Mode, as relay.Config.Wakeup spells them.
const (
	// ModeAuto follows the WAL where the server allows it, else polls.
	ModeAuto = "auto"
	// ModeWAL follows the WAL, and polls while it cannot (warned).
	ModeWAL = "wal"
	// ModePoll polls the outbox for new rows.
	ModePoll = "poll"
	// ModeNotify relies on the writers' trigger, which notifies every
	// relay at commit; the watcher only looks for rows that came due.
	ModeNotify = "notify"
)

// Hooks hear how the process learns of new rows. relay.Hooks has the
// method, so a relay passes its hooks as they are.
type Hooks interface {
	// Wakeup reports the source when it changes: "wal" or "poll" while
	// this process is the schema's watcher, "follow" while another
	// process is, "notify" when the writers' trigger wakes the relays, "-"
	// while the LISTEN session is down; fallback is true when the WAL was
	// wanted and could not be followed, err says why.
	Wakeup(source string, fallback bool, err error)
}

// Config is what a Waker needs; New checks it.
type Config struct {
	// Pool gives the LISTEN session, one connection held while the Waker
	// runs; the WAL stream opens a replication connection of its own
	// with the pool's connection settings, its BeforeConnect hook run
	// for it (the password of the moment: relay.PoolConfig.Password).
	// Required.
	Pool *pgxpool.Pool
	// Schema is the outbox's schema. Default "outbox" (as
	// store.NewSchema).
	Schema string
	// Mode is how the watcher learns of new rows: ModeAuto, ModeWAL,
	// ModePoll or ModeNotify. Default ModeAuto.
	Mode string
	// WatchInterval is the longest the watcher waits between two looks
	// for new rows while it polls. Required, at least 1ms.
	WatchInterval time.Duration
	// Heartbeat is how often a follower tries the watcher's lock again:
	// the relays' heartbeat, so that a watcher that died is replaced
	// within about one. Required.
	Heartbeat time.Duration
	// Logger receives the wake-up's logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks hear when the wake-up's source changes. Default none.
	Hooks Hooks
	// Signals carries the wake-up's test signals (Elected, Following,
	// WAL, Polling, WatcherIdle), and its clock is the Waker's, which
	// tests move ahead. Default nil: no signals, the wall clock.
	Signals *testsig.Bus
	// Wake wakes this process's workers of the lanes that may have new
	// rows (an empty set: every lane). Called from the Waker's goroutine
	// only. Required.
	Wake func(lanes.Set)
	// Members is called with freed false when relays came or went, and
	// true when lanes were handed back (store.FreedPayload). Default
	// none.
	Members func(freed bool)
}

// New checks cfg (errors name the field) and returns the wake-up it
// describes, not running yet.
func New(cfg Config) (*Waker, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("outbox: wake: %s: "+format, append([]any{field}, args...)...))
	}
	if cfg.Pool == nil {
		bad("pool", "required")
	}
	s, err := store.NewSchema(cfg.Schema)
	if err != nil {
		errs = append(errs, err)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	switch cfg.Mode {
	case ModeAuto, ModeWAL, ModePoll, ModeNotify:
	default:
		bad("mode", "must be one of auto, wal, poll, notify, got %q", cfg.Mode)
	}
	if cfg.WatchInterval < time.Millisecond {
		bad("watch-interval", "must be at least 1ms, got %s", cfg.WatchInterval)
	}
	if cfg.Heartbeat <= 0 {
		bad("heartbeat", "must be positive, got %s", cfg.Heartbeat)
	}
	if cfg.Wake == nil {
		bad("wake", "required")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hooks == nil {
		cfg.Hooks = nopHooks{}
	}
	if cfg.Members == nil {
		cfg.Members = func(bool) {}
	}
	return &Waker{cfg: cfg, log: cfg.Logger, s: s, w: store.NewWaker(s), source: "-", expect: map[int64]time.Time{}}, nil
}

type nopHooks struct{}

func (nopHooks) Wakeup(string, bool, error) {}

// Watcher timing.
const (
	// watchFast is the watcher's polling interval while rows keep arriving;
	// once watchLinger has passed without a new row it doubles at each
	// look that finds nothing, up to WatchInterval. The linger keeps a
	// trickle (50 messages/s: a row every 20 ms) on the fast interval:
	// doubling at once put its wake-ups 10–20 ms behind (p99 22 ms, commit
	// to Kafka consumer), while an idle outbox still backs off within a
	// second. 2 ms rather than 5: measured in quick latency runs, 3 pairs
	// alternated, p50 4.1–4.7 → 2.4–2.6 ms and p99 8.1–9.8 → 6.2–9.5 ms at
	// 1,000 msg/s, p99 6.2–7.7 → 3.3–4.6 ms at 50 msg/s.
	watchFast = 2 * time.Millisecond
	// watchBusy is the interval while rows come faster than
	// watchBusyRate: each look wakes claims, and at the writers' full
	// speed a 2 ms interval cost them 15–20 % of their rate beside a
	// draining relay (more, smaller claims), where 5 ms merges more rows
	// into each (measured when it was chosen; where those runs are:
	// docs/benchmarks.md, "Earlier measurements").
	watchBusy     = 5 * time.Millisecond
	watchBusyRate = 2000 // rows per second
	// watchFull is the interval while rows come faster than
	// watchFullRate, about where 16 writers on two cores are at full
	// speed beside a relay: each look then still merges some 80 rows into
	// the claims it wakes. Beside a draining relay, 16 writers committed
	// 8.6–8.8k rows/s instead of 7.6–8.0k with 5 ms, and the relay's
	// process and sessions used a third less CPU (throwaway cluster,
	// pgbench, alternated; the run is in the git history of
	// docs/benchmarks.md). Below that rate (the latency targets' 50, 1,000
	// and 5,000 msg/s) nothing changes.
	watchFull     = 10 * time.Millisecond
	watchFullRate = 6000 // rows per second
	watchLinger   = 250 * time.Millisecond
	// watchTrickle is the longest interval between the looks of a
	// trickle (rows that come farther apart than watchFast, within
	// watchLinger of each other): a row waits at most about this long for
	// its look.
	watchTrickle = 5 * time.Millisecond
	// notifyGap is the least time between two NOTIFYs of the watcher:
	// wake-ups closer than that are merged (a busy relay is not waiting
	// for them anyway).
	notifyGap = 2 * time.Millisecond
	// dueEvery is the longest the watcher goes without looking for rows
	// that came due (retries, delayed messages): a retry scheduled after
	// its last look is seen within dueEvery, and woken when due from
	// then on (its first delay is a second by default). The look also
	// says when the next row comes due, and the watcher looks again then.
	dueEvery = time.Second
	// maxGaps and gapTTL bound the ids the polling watcher looks for
	// again: ids below the newest it saw that were missing, because a
	// transaction took its id before another one's and committed after
	// it. A gap that is still empty after gapTTL is forgotten (a rolled
	// back or long-since delivered row, or a writer's transaction longer
	// than gapTTL, whose row then waits for the workers' safety poll).
	maxGaps = 64
	gapTTL  = time.Second
	// gapSpan bounds how far below the newest id a look returns the ids
	// it found (to tell the gaps): a burst of 10,000 rows costs 128 ids,
	// not 10,000; a gap further down in a burst is left to the safety
	// poll, like those past maxGaps.
	gapSpan = 2 * maxGaps
	// walClaimWait is how long a lone watcher that woke a row's lane
	// straight from the WAL stream's report waits for a claim of its
	// process to return the row before it looks for it (the claim
	// looked before the writer's transaction was visible, or the row is
	// in a lane this process does not hold). From the wake-up: 16
	// writers at 1,000 msg/s saw claims return rows 5 ms after their
	// report, a wake-up merged over walMergeGap included, for 2.8 % of
	// them (each then cost a look); 1 row in 10,000 was not claimed
	// within 20 ms. walMergeGap is the least
	// time between two such wake-ups: reports closer than that wake one
	// claim for their lanes together. At 1,000 msg/s 2 ms cost 0.65
	// claims a message and 1.2 × the relay and session CPU of polling;
	// 4 ms 0.46 claims and 0.93–1.03 × (docs/benchmarks.md, "What bounds
	// a trickle's cost"). A trickle's rows, farther apart, are woken at
	// once.
	walClaimWait = 10 * time.Millisecond
	walMergeGap  = 4 * time.Millisecond
	// maxExpect bounds the rows the watcher waits for a claim of: past
	// it, reports are looked for as without lanes.
	maxExpect = 4096
	// claimedRing is how many of the rows claimed last the Waker keeps
	// the ids of: a claim woken for another row of the lane, or visiting
	// every lane, returns a row before the stream reports it (3 % of the
	// rows at 1,000 msg/s, by 0.6 ms), and that row is not waited for.
	// At 1,000 msg/s the ring holds the last 4 s.
	claimedRing = 4096
	// walRecheck is how soon the watcher looks again when its look
	// after the WAL stream's report found no new row: the writer's
	// transaction becomes visible a moment after the stream carries it
	// (a fast interval of 5 ms put the p99 of 50 msg/s at 7 ms, against
	// 4 ms waking from the stream alone).
	walRecheck = time.Millisecond
	// walRetryMin and walRetryMax bound the wait before the watcher tries
	// the WAL again after it could not follow it.
	walRetryMin, walRetryMax = time.Second, 5 * time.Minute
	// othersEvery is how often, at most, the watcher checks whether
	// anyone else listens before it sends a wake-up (see
	// store.Waker.Others): a relay running alone, the usual deployment,
	// sends none, each a transaction of its own (docs/benchmarks.md, "Measured:
	// what an idle relay costs, and why").
	// A listener that joins says so at once (store.ListenerPayload).
	othersEvery = time.Second
	// electGap is the least time between a follower's tries of the
	// watcher's lock prompted by membership notifications.
	electGap = service.NotificationGap
)

// Waker is one process's wake-up: its LISTEN session and, while it is the
// watcher, what it watches. Start runs it, Stop ends it (see
// service.Service).
type Waker struct {
	service.Loop

	cfg Config
	log *slog.Logger
	s   store.Schema
	w   *store.Waker

	source string // last reported to the hooks
	// pooled: the LISTEN connection goes through a transaction-pooling
	// proxy (see session).
	pooled bool

	// The WAL follower asks the LISTEN loop to notify the other processes
	// about some lanes (pending: all of them when pendLanes is empty) and
	// interrupts its wait (cancelWait).
	pendMu    sync.Mutex
	pending   bool
	pendLanes lanes.Set
	walDone   atomic.Pointer[error]
	walUp     atomic.Bool // the WAL stream has started (see loop)
	walRows   atomic.Bool // the WAL stream reported rows committed
	walMu     sync.Mutex
	walIDs    []int64   // the ids of those rows (see walReportIDs)
	walLns    lanes.Set // and their lanes
	// walPart: some row of those reports is not in walIDs, or its lane
	// is not in walLns.
	walPart bool
	// expect: the rows the watcher woke their lanes for straight from the
	// stream's report, by id, with when; a claim of this process that
	// returns one takes it out (Claimed). claimed: the ids the last
	// claims returned (claimedN of them so far, the newest at claimedN-1
	// modulo its length): a claim woken for another row may take a row
	// before the stream reports it. streaming: the watcher follows the
	// stream, so Claimed has something to record.
	expect     map[int64]time.Time
	claimed    [claimedRing]int64
	claimedN   uint64
	streaming  atomic.Bool
	cancelWait atomic.Pointer[context.CancelFunc]

	// wokeAt is when the LISTEN loop last woke this process's workers
	// (see watch.idle).
	wokeAt time.Time
}

// Start runs the wake-up in a goroutine of its own until ctx ends or
// Stop is called: LISTEN sessions one after another, each until it
// fails, with the reconnect backoff between them. A Waker runs once.
func (k *Waker) Start(ctx context.Context) error { return k.StartLoop(ctx, k.run) }

// run is the Waker's loop: while its LISTEN session is down, nothing
// wakes the workers but their own safety poll.
func (k *Waker) run(ctx context.Context) {
	bo := service.ReconnectBackoff()
	for ctx.Err() == nil {
		err := k.session(ctx, bo.Reset)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		k.log.Warn("listen connection lost; polling until it is back", "error", err, "retry_in", d)
		k.setSource("-", false, err)
		service.Sleep(ctx, d)
	}
}

// Claimed tells the wake-up which rows a claim of this process returned
// (their ids): the watcher stops waiting for those it woke a lane for
// straight from the WAL stream (see followStream). The relay's workers
// call it after every claim that returned rows: while the watcher follows
// the stream, a store into a ring a row, and a map delete while it waits
// for some; otherwise nothing.
func (k *Waker) Claimed(ids iter.Seq[int64]) {
	if !k.streaming.Load() {
		return
	}
	k.walMu.Lock()
	defer k.walMu.Unlock()
	expecting := len(k.expect) > 0
	for id := range ids {
		k.claimed[k.claimedN%claimedRing] = id
		k.claimedN++
		if expecting {
			delete(k.expect, id)
		}
	}
}

// claimedLately reports whether one of the last claimedRing rows claimed
// was id. Called with walMu held.
func (k *Waker) claimedLately(id int64) bool {
	n := min(k.claimedN, claimedRing)
	for i := range n {
		if k.claimed[(k.claimedN-1-i)%claimedRing] == id {
			return true
		}
	}
	return false
}

// wakeUp wakes this process's workers of lanes (an empty set: all lanes).
func (k *Waker) wakeUp(ls lanes.Set) {
	k.wokeAt = k.now()
	k.cfg.Wake(ls)
}

// wakeAndTell wakes this process's workers of lanes at once and the other
// relays' with the next NOTIFY (an empty set: all lanes).
func (k *Waker) wakeAndTell(ls lanes.Set) {
	k.wakeUp(ls)
	k.addPending(ls)
}

// addPending merges lanes into the next NOTIFY (an empty set: all lanes).
func (k *Waker) addPending(ls lanes.Set) {
	k.pendMu.Lock()
	defer k.pendMu.Unlock()
	switch {
	case !k.pending:
		k.pendLanes = ls
	case k.pendLanes.Empty() || ls.Empty():
		k.pendLanes = lanes.Set{} // all lanes already, or now
	default:
		k.pendLanes.Union(ls)
	}
	k.pending = true
}

// isPending reports whether a NOTIFY waits to be sent.
func (k *Waker) isPending() bool {
	k.pendMu.Lock()
	defer k.pendMu.Unlock()
	return k.pending
}

// takePending returns the payload of the NOTIFY to send, if one waits.
func (k *Waker) takePending() (string, bool) {
	k.pendMu.Lock()
	defer k.pendMu.Unlock()
	if !k.pending {
		return "", false
	}
	k.pending = false
	p := k.pendLanes.Payload()
	k.pendLanes = lanes.Set{}
	return p, true
}

// kick asks the LISTEN loop to act now (a NOTIFY to send, the WAL stream
// ended).
func (k *Waker) kick() {
	if c := k.cancelWait.Load(); c != nil {
		(*c)()
	}
}

// setSource reports the wake-up source to the hooks when it changes.
func (k *Waker) setSource(source string, fallback bool, err error) {
	if source == k.source && !fallback {
		return
	}
	k.source = source
	switch source {
	case "wal":
		k.cfg.Signals.Emit(testsig.WAL, 0)
	case "poll":
		k.cfg.Signals.Emit(testsig.Polling, 0)
	}
	k.cfg.Hooks.Wakeup(source, fallback, err)
}

// now is the Waker's clock: time.Now, unless a test moved it ahead.
func (k *Waker) now() time.Time { return k.cfg.Signals.Now() }

// session runs one LISTEN session until it fails or ctx ends.
func (k *Waker) session(ctx context.Context, connected func()) error {
	conn, err := k.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection carries LISTEN state and the watcher's lock: never
	// give it back to the pool (but keep it counted there, see service.DropConn).
	defer service.DropConn(context.WithoutCancel(ctx), conn)
	pc := conn.Conn()
	pooled, err := store.Pooled(ctx, pc)
	if err != nil {
		return err
	}
	if pooled {
		// Through a transaction-pooling proxy LISTEN and the watcher's
		// lock would stay on a backend that other clients then use (and
		// the lock with it, after this relay stopped, so that no relay
		// watched again): this process keeps neither, and looks for new
		// and due rows itself, for its own workers only.
		k.pooled = true
		connected()
		k.wakeUp(lanes.Set{})
		k.cfg.Members(false)
		return k.loop(ctx, pc, false, true)
	}
	if err := store.Listen(ctx, pc, k.s); err != nil {
		return err
	}
	if err := k.w.Join(ctx, pc, k.s); err != nil {
		return err
	}
	if err := k.w.PrepareLooks(ctx, pc); err != nil {
		return err
	}
	connected()
	k.wakeUp(lanes.Set{}) // anything written while this process was not listening
	k.cfg.Members(false)  // and relays that came or went meanwhile

	mode := k.cfg.Mode
	if mode == ModeNotify {
		on, err := k.w.NotifyTrigger(ctx, pc, k.s, true)
		switch {
		case err != nil && !errors.Is(err, store.ErrNotOwner):
			return err
		case on:
			k.setSource("notify", false, nil)
			return k.loop(ctx, pc, false, false)
		default:
			k.log.Error("wakeup notify: the messages_notify trigger is disabled and this role may not enable it; run `outbox-relay migrate --wakeup notify` as the schema's owner. Polling meanwhile", "error", err)
			mode = ModePoll
		}
	}
	return k.loop(ctx, pc, mode != ModePoll, true)
}

// gapList is the polling watcher's list of ids it looks for again (see
// maxGaps), newest last.
type gapList []gap

type gap struct {
	id    int64
	until time.Time
	// reported: the WAL stream reported the id's commit (addIDs), so a
	// row is expected there; other gaps are ids the looks passed, which
	// may never be used.
	reported bool
}

// ids drops the gaps that expired and returns the others' ids.
func (g *gapList) ids(now time.Time) []int64 {
	*g = slices.DeleteFunc(*g, func(x gap) bool { return !now.Before(x.until) })
	ids := make([]int64, len(*g))
	for i, x := range *g {
		ids[i] = x.id
	}
	return ids
}

// fill drops the gaps whose rows were found.
func (g *gapList) fill(found []int64) {
	*g = slices.DeleteFunc(*g, func(x gap) bool { return slices.Contains(found, x.id) })
}

// recentIDs are the ids the watcher's looks found in the last gapTTL.
type recentIDs map[int64]time.Time

func (r recentIDs) add(ids []int64, now time.Time) {
	if len(r) > 4096 {
		for id, t := range r {
			if now.Sub(t) >= gapTTL {
				delete(r, id)
			}
		}
	}
	for _, id := range ids {
		r[id] = now
	}
}

func (r recentIDs) has(id int64, now time.Time) bool {
	t, ok := r[id]
	return ok && now.Sub(t) < gapTTL
}

// keepNewest drops all but the newest maxGaps gaps.
func (g *gapList) keepNewest() {
	if n := len(*g); n > maxGaps {
		*g = append((*g)[:0], (*g)[n-maxGaps:]...)
	}
}

// addIDs records the ids of reported rows to look for (keeping the
// newest maxGaps).
func (g *gapList) addIDs(ids []int64, now time.Time) {
	for _, id := range ids {
		*g = append(*g, gap{id: id, until: now.Add(gapTTL), reported: true})
	}
	g.keepNewest()
}

// reported reports whether a reported row is still looked for.
func (g gapList) reported(now time.Time) bool {
	return slices.ContainsFunc(g, func(x gap) bool { return x.reported && now.Before(x.until) })
}

// add records the ids missing between seen and the ids a look found
// (ascending), keeping the newest maxGaps.
func (g *gapList) add(seen int64, ids []int64, now time.Time) {
	prev := seen
	for _, id := range ids {
		for m := max(prev+1, id-maxGaps); m < id; m++ {
			*g = append(*g, gap{id: m, until: now.Add(gapTTL)})
		}
		prev = max(prev, id)
	}
	g.keepNewest()
}
