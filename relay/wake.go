package relay

import (
	"context"
	"errors"
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

// Wake-up: docs/design.md ("Wake-up") explains it once. This file holds
// the waker (one per process: its LISTEN session, the NOTIFYs it hears,
// and the workers it wakes); watch.go is the watcher's state machine and
// wal.go the WAL stream. Wake-ups are an optimization: a lost one costs
// latency up to PollInterval, never a message.

func (r *Relay) wakeAll() {
	for i := range r.wake {
		r.wakeWorker(i)
	}
}

// wakeWorker makes worker w visit all of its lanes now.
func (r *Relay) wakeWorker(w int) {
	r.pend[w].AddAll()
	select {
	case r.wake[w] <- struct{}{}:
	default:
	}
}

// Wake makes every worker look for work now (as a notification does).
func (r *Relay) Wake() {
	r.stats.Wakeups.Add(1)
	r.wakeAll()
}

// wakeSet wakes the workers of lanes, or all of them when lanes is empty.
func (r *Relay) wakeSet(ls lanes.Set) {
	r.stats.Wakeups.Add(1)
	if ls.Empty() {
		r.wakeAll()
		return
	}
	r.wakeLanes(ls)
}

// listen runs the wake-up of cfg.Schema for one process, as cfg.Wakeup
// says, calling wake with the lanes that may have new rows (an empty set:
// any lane), until ctx ends. A relay runs it itself unless it is in a Set,
// which runs one for all its relays. It holds one connection of pool
// (LISTEN) and, while this process follows the WAL, a replication
// connection of its own.
//
// members is called with freed false when relays came or went, and true
// when lanes were handed back (store.FreedPayload).
func listen(ctx context.Context, pool *pgxpool.Pool, cfg Config, wake func(lanes.Set), members func(freed bool)) {
	cfg = cfg.WithDefaults()
	log := cfg.Logger
	s, err := store.NewSchema(cfg.Schema)
	if err != nil {
		log.Error("cannot listen for notifications; polling", "error", err)
		<-ctx.Done()
		return
	}
	if members == nil {
		members = func(bool) {}
	}
	k := &waker{cfg: cfg, pool: pool, log: log, s: s, w: store.NewWaker(s), wake: wake, members: members, source: "-"}
	bo := service.ReconnectBackoff()
	for ctx.Err() == nil {
		err := k.session(ctx, bo.Reset)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		log.Warn("listen connection lost; polling until it is back", "error", err, "retry_in", d)
		k.setSource("-", false, err)
		service.Sleep(ctx, d)
	}
}

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
)

// waker is one process's wake-up: its LISTEN session and, while it is the
// watcher, what it watches.
type waker struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger
	s    store.Schema
	w    *store.Waker
	wake func(lanes.Set)
	// members: relays joined or left (false), or handed lanes back
	// (freed: true).
	members func(freed bool)

	source string // last reported to the hooks
	// pooled: the LISTEN connection goes through a transaction-pooling
	// proxy (see session).
	pooled bool

	// The WAL follower asks the LISTEN loop to notify the other processes
	// about some lanes (pending: all of them when pendLanes is empty) and
	// interrupts its wait (cancelWait).
	pendMu     sync.Mutex
	pending    bool
	pendLanes  lanes.Set
	walDone    atomic.Pointer[error]
	walUp      atomic.Bool // the WAL stream has started (see loop)
	walRows    atomic.Bool // the WAL stream reported rows committed
	walMu      sync.Mutex
	walIDs     []int64 // the ids of those rows (see walReportIDs)
	cancelWait atomic.Pointer[context.CancelFunc]

	// wokeAt is when the LISTEN loop last woke this process's workers
	// (see watch.idle).
	wokeAt time.Time
}

// wakeUp wakes this process's workers of lanes (an empty set: all lanes).
func (k *waker) wakeUp(ls lanes.Set) {
	k.wokeAt = k.now()
	k.wake(ls)
}

// wakeAndTell wakes this process's workers of lanes at once and the other
// relays' with the next NOTIFY (an empty set: all lanes).
func (k *waker) wakeAndTell(ls lanes.Set) {
	k.wakeUp(ls)
	k.addPending(ls)
}

// addPending merges lanes into the next NOTIFY (an empty set: all lanes).
func (k *waker) addPending(ls lanes.Set) {
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
func (k *waker) isPending() bool {
	k.pendMu.Lock()
	defer k.pendMu.Unlock()
	return k.pending
}

// takePending returns the payload of the NOTIFY to send, if one waits.
func (k *waker) takePending() (string, bool) {
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
func (k *waker) kick() {
	if c := k.cancelWait.Load(); c != nil {
		(*c)()
	}
}

// setSource reports the wake-up source to the hooks when it changes.
func (k *waker) setSource(source string, fallback bool, err error) {
	if source == k.source && !fallback {
		return
	}
	k.source = source
	switch source {
	case "wal":
		k.cfg.sig.Emit(testsig.WAL, 0)
	case "poll":
		k.cfg.sig.Emit(testsig.Polling, 0)
	}
	k.cfg.Hooks.Wakeup(source, fallback, err)
}

// now is the waker's clock: time.Now, unless a test moved it ahead.
func (k *waker) now() time.Time { return k.cfg.sig.Now() }

// session runs one LISTEN session until it fails or ctx ends.
func (k *waker) session(ctx context.Context, connected func()) error {
	conn, err := k.pool.Acquire(ctx)
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
		k.members(false)
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
	k.wakeUp(lanes.Set{}) // anything written while we were not listening
	k.members(false)      // and relays that came or went meanwhile

	mode := k.cfg.Wakeup
	if mode == WakeupNotify {
		on, err := k.w.NotifyTrigger(ctx, pc, k.s, true)
		switch {
		case err != nil && !errors.Is(err, store.ErrNotOwner):
			return err
		case on:
			k.setSource("notify", false, nil)
			return k.loop(ctx, pc, false, false)
		default:
			k.log.Error("wakeup notify: the messages_notify trigger is disabled and this role may not enable it; run `outbox-relay migrate --wakeup notify` as the schema's owner. Polling meanwhile", "error", err)
			mode = WakeupPoll
		}
	}
	return k.loop(ctx, pc, mode != WakeupPoll, true)
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
