package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// Wake-up. Workers claim in a loop and, when they find nothing, wait for a
// wake-up or their PollInterval. What wakes them must cost the writers
// nothing, so no trigger runs in the writers' transactions by default:
// one relay process per schema, the watcher (elected with an advisory
// lock held by its LISTEN session, so it changes hands the moment that
// session dies), learns of new rows from the WAL or by polling, and of
// retries and delayed messages coming due by looking them up in the
// index of waiting rows, wakes its own workers at once and the other
// processes with a NOTIFY from its own session. Every process LISTENs on
// the schema's channel; a notification with an empty payload means "new
// rows", other payloads belong to other listeners and are not a reason to
// claim. Wake-ups are an optimization:
// a lost one costs latency up to PollInterval, never a message.

func (r *Relay) wakeAll() {
	for i, c := range r.wake {
		r.pend[i].addAll()
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Wake makes every worker look for work now (as a notification does).
func (r *Relay) Wake() { r.wakeAll() }

// WakeupHooks is implemented by hooks that want to know how the process
// learns of new rows. Wakeup is called when that changes: source is "wal"
// or "poll" while this process is the schema's watcher, "follow" while
// another process is, "notify" when the writers' trigger wakes the relays;
// fallback is true when the WAL was wanted and could not be followed (the
// stream broke, or logical replication is not allowed), err says why.
type WakeupHooks interface {
	Wakeup(source string, fallback bool, err error)
}

func (m multiHooks) Wakeup(source string, fallback bool, err error) {
	for _, h := range m {
		if wh, ok := h.(WakeupHooks); ok {
			wh.Wakeup(source, fallback, err)
		}
	}
}

// Listen wakes (calls wake) on every notification of new rows in schema's
// outbox, in the default wake-up mode ("auto"), until ctx ends. See
// ListenConfig, which also passes on membership changes.
func Listen(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger, wake func()) {
	ListenConfig(ctx, pool, Config{Schema: schema, Logger: log}, wake, nil)
}

// ListenConfig runs the wake-up of cfg.Schema for one process, as
// cfg.Wakeup says, calling wake when there may be new rows, until ctx
// ends. A relay runs it itself unless Config.SharedListener is set: a
// process running several relays (one per route) saves a connection per
// relay by running one ListenConfig that wakes them all, as a Set does.
// It holds one connection of pool (LISTEN) and, while this process
// follows the WAL, a replication connection of its own.
//
// members (unless nil) is called when relays joined, left or handed lanes
// back (a notification from a relay's lease session, payload
// store.MembersPayload or store.FreedPayload), and after every
// reconnection: a process running its relays with a shared listener
// calls Relay.MembersChanged of each, so that they rebalance at once
// instead of at their next heartbeat. (A Set's own listener passes freed
// lanes only to its relays below their share.)
// Notifications are an optimization: workers poll and leases rebalance at
// every heartbeat anyway, so a lost connection costs only latency.
func ListenConfig(ctx context.Context, pool *pgxpool.Pool, cfg Config, wake, members func()) {
	var notified func(bool)
	if members != nil {
		notified = func(bool) { members() }
	}
	listen(ctx, pool, cfg, func(laneSet) { wake() }, notified)
}

// wakeSet wakes the workers of lanes, or all of them when lanes is empty.
func (r *Relay) wakeSet(lanes laneSet) {
	if lanes.empty() {
		r.wakeAll()
		return
	}
	r.wakeLanes(lanes)
}

// listen is ListenConfig, with wake-ups about some lanes (an empty set:
// any lane).
//
// members is called with freed false when relays came or went, and true
// when lanes were handed back (store.FreedPayload).
func listen(ctx context.Context, pool *pgxpool.Pool, cfg Config, wake func(laneSet), members func(freed bool)) {
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
	bo := newReconnectBackoff()
	for ctx.Err() == nil {
		err := k.session(ctx, bo.Reset)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		log.Warn("listen connection lost; polling until it is back", "error", err, "retry_in", d)
		k.setSource("-", false, err)
		sleep(ctx, d)
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
	// into each (README, "Wake-ups at 2 ms").
	watchBusy     = 5 * time.Millisecond
	watchBusyRate = 2000 // rows per second
	// watchFull is the interval while rows come faster than
	// watchFullRate, about where 16 writers on two cores are at full
	// speed beside a relay: each look then still merges some 80 rows into
	// the claims it wakes. Beside a draining relay, 16 writers committed
	// 8.6–8.8k rows/s instead of 7.6–8.0k with 5 ms, and the relay's
	// process and sessions used a third less CPU (throwaway cluster,
	// pgbench, alternated; README, "Claims among dead rows, and wake-ups
	// at full speed"). Below that rate (the latency targets' 50, 1,000
	// and 5,000 msg/s) nothing changes.
	watchFull     = 10 * time.Millisecond
	watchFullRate = 6000 // rows per second
	watchLinger   = 250 * time.Millisecond
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
	// sends none, each a transaction of its own (measured in the README).
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
	wake func(laneSet)
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
	pendLanes  laneSet
	walDone    atomic.Pointer[error]
	walUp      atomic.Bool // the WAL stream has started (see loop)
	walRows    atomic.Bool // the WAL stream reported rows committed
	walMu      sync.Mutex
	walIDs     []int64 // the ids of those rows (see walReportIDs)
	cancelWait atomic.Pointer[context.CancelFunc]
}

// wakeAndTell wakes this process's workers of lanes at once and the other
// relays' with the next NOTIFY (an empty set: all lanes).
func (k *waker) wakeAndTell(lanes laneSet) {
	k.wake(lanes)
	k.addPending(lanes)
}

// addPending merges lanes into the next NOTIFY (an empty set: all lanes).
func (k *waker) addPending(lanes laneSet) {
	k.pendMu.Lock()
	defer k.pendMu.Unlock()
	switch {
	case !k.pending:
		k.pendLanes = lanes
	case k.pendLanes.empty() || lanes.empty():
		k.pendLanes = laneSet{} // all lanes already, or now
	default:
		k.pendLanes.union(lanes)
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
	if k.pendLanes.empty() {
		return "", true
	}
	p := k.pendLanes.payload()
	k.pendLanes = laneSet{}
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
	if wh, ok := k.cfg.Hooks.(WakeupHooks); ok {
		wh.Wakeup(source, fallback, err)
	}
}

// session runs one LISTEN session until it fails or ctx ends.
func (k *waker) session(ctx context.Context, connected func()) error {
	conn, err := k.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection carries LISTEN state and the watcher's lock: never
	// give it back to the pool (but keep it counted there, see dropConn).
	defer dropConn(context.WithoutCancel(ctx), conn)
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
		k.wake(laneSet{})
		k.members(false)
		return k.loop(ctx, pc, false, true)
	}
	if err := store.Listen(ctx, pc, k.s); err != nil {
		return err
	}
	if err := k.w.Join(ctx, pc, k.s); err != nil {
		return err
	}
	connected()
	k.wake(laneSet{}) // anything written while we were not listening
	k.members(false)  // and relays that came or went meanwhile

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

// loop waits for notifications on pc and, once this session holds the
// watcher lock, watches for rows that came due and, with rows (unless the
// writers' trigger does), for new rows: through the WAL when wal is set
// and the server allows it, else by polling.
func (k *waker) loop(ctx context.Context, pc *pgx.Conn, wal, rows bool) error {
	var (
		watching, polling bool
		// streaming: the WAL stream runs, and says when rows were
		// committed; the watcher then looks for them (the poll's look)
		// at once, and on the fast interval until watchLinger has passed
		// without a report or a row, then stops looking.
		streaming  bool
		walRowsAt  time.Time // the stream's last report
		lastLook   time.Time // the watcher's last look for new rows
		nextElect  time.Time // when a follower next tries the lock
		lastElect  time.Time // when it last tried
		seen       int64     = -1
		interval             = watchFast
		nextPoll   time.Time
		lastNotify time.Time
		lastRows   time.Time // when the watcher last found new rows
		walRetry   = walRetryMin
		walAgain   time.Time // when to try the WAL again
		walStarted time.Time
		walLogged  bool
		stopWAL    = func() {}
		gaps       gapList
		recent     = recentIDs{} // ids the looks found lately (WAL mode)
		dueAt      time.Time     // when to look for rows that came due
		dueSince   int64         // the database's clock at the last look (see store.Due)
		lowered    int64         // the outbox's newest id when seen was last lowered to it
		// alone: nobody else listens (see store.Waker.Others), so the
		// watcher's wake-ups would wake nobody and are not sent; checked
		// again before a wake-up at most every othersEvery, and at the
		// next one after a membership notification; false for
		// othersEvery after a listener said it started.
		alone    bool
		othersAt time.Time
	)
	host, pid := processIdentity()
	// tell sends a wake-up to the other listeners, unless there are none
	// (or this session, through a proxy, cannot know).
	tell := func(now time.Time, payload string) error {
		if k.pooled {
			return nil
		}
		if !now.Before(othersAt) {
			others, err := k.w.Others(ctx, pc, k.s, host, pid)
			if err != nil {
				return err
			}
			alone, othersAt = !others, now.Add(othersEvery)
		}
		if alone {
			return nil
		}
		return k.w.Notify(ctx, pc, payload)
	}
	defer func() { stopWAL() }()
	startWAL := func() {
		walCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		k.walDone.Store(nil)
		walStarted = time.Now()
		go func() {
			defer close(done)
			err := k.followWAL(walCtx, func(ids []int64) {
				k.walMu.Lock()
				if len(k.walIDs) < maxGaps {
					k.walIDs = append(k.walIDs, ids[:min(len(ids), maxGaps-len(k.walIDs))]...)
				}
				k.walMu.Unlock()
				k.walRows.Store(true)
				k.kick()
			}, func() {
				k.walUp.Store(true)
				k.kick()
			})
			if err == nil {
				err = errors.New("outbox: WAL stream ended")
			}
			k.walDone.Store(&err)
			k.kick()
		}()
		stopWAL = func() { cancel(); <-done }
		// Keep polling until the stream has started: rows committed
		// before the slot's consistent point are not in the stream.
		if !polling {
			polling, seen, interval, nextPoll = true, -1, watchFast, time.Now()
		}
	}
	for {
		now := time.Now()
		if !watching && !now.Before(nextElect) {
			ok := k.pooled // a pooled session watches for its own process alone
			if !ok {
				var err error
				if ok, err = k.w.TryWatch(ctx, pc, k.s); err != nil {
					return err
				}
			}
			if ok {
				watching = true
				switch {
				case k.pooled:
					k.log.Info("connected through a transaction-pooling proxy: this process looks for new rows and rows that come due itself, without LISTEN or the watcher's lock")
					polling = true
					k.setSource("poll", false, nil)
				case !rows:
					k.log.Info("this process watches the outbox for rows that come due (retries, delayed messages) and wakes the other relays")
				case wal:
					k.log.Info("this process watches the outbox for new rows and wakes the other relays", "wal", wal)
					startWAL()
				default:
					k.log.Info("this process watches the outbox for new rows and wakes the other relays", "wal", wal)
					polling = true
					k.setSource("poll", false, nil)
				}
				// Rows written since the last watcher died were seen by
				// nobody: everyone looks once.
				k.wakeAndTell(laneSet{})
			} else {
				lastElect = now
				nextElect = now.Add(k.cfg.Heartbeat)
				if rows {
					k.setSource("follow", false, nil)
				}
			}
		}
		if watching {
			if k.walUp.Swap(false) {
				// The stream runs: looks follow its reports from now on;
				// everyone looks once for what was committed between the
				// last look and the slot's consistent point.
				streaming = true
				k.setSource("wal", false, nil)
				k.wakeAndTell(laneSet{})
			}
			if k.walRows.Swap(false) && streaming {
				// Rows were committed. The stream carries a commit as soon
				// as its WAL record is flushed, a moment before the
				// writer's transaction is visible to other sessions: a
				// claim woken by the report itself could miss the row,
				// and a claim visits only the lanes it was woken about.
				// The look sees only visible rows, and keeps looking while
				// reports come (a row not visible yet is found by the next
				// look, or looked for again as a gap).
				// Reports closer than notifyGap share a look. A reported
				// row below the ids the looks have passed (its writer took
				// its id long before it committed) is looked for by id.
				// (Most reported rows below it were found by a look before
				// their report came: those are not looked for again.)
				k.walMu.Lock()
				if seen >= 0 {
					gaps.addIDs(slices.DeleteFunc(k.walIDs, func(id int64) bool { return id > seen || recent.has(id, now) }), now)
				}
				k.walIDs = nil
				k.walMu.Unlock()
				walRowsAt = now
				if !polling {
					polling, interval = true, watchFast
				}
				nextPoll = lastLook.Add(notifyGap)
			}
			if errp := k.walDone.Swap(nil); errp != nil {
				streaming = false
				stopWAL()
				stopWAL = func() {}
				err := *errp
				if time.Since(walStarted) > time.Minute {
					walRetry = walRetryMin // it ran for a while: a break, not a refusal
				}
				if walRefused(err) {
					walRetry = walRetryMax
				}
				lvl := slog.LevelWarn
				if k.cfg.Wakeup == WakeupAuto && walRefused(err) {
					lvl = slog.LevelInfo // auto, and the server does not allow it: expected
					if walLogged {
						lvl = slog.LevelDebug
					}
				}
				walLogged = true
				k.log.Log(ctx, lvl, "cannot follow the WAL; polling for new rows instead", "error", err, "retry_wal_in", walRetry)
				k.setSource("poll", true, err)
				polling, seen, interval, nextPoll = true, -1, watchFast, now
				walAgain = now.Add(walRetry)
				walRetry = min(2*walRetry, walRetryMax)
				// Rows may have come while the stream was failing.
				k.wakeAndTell(laneSet{})
			}
			if wal && polling && !walAgain.IsZero() && !now.Before(walAgain) {
				walAgain = time.Time{}
				startWAL()
			}
			if now.Sub(lastNotify) >= notifyGap {
				if payload, ok := k.takePending(); ok {
					if err := tell(now, payload); err != nil {
						return err
					}
					lastNotify = now
				}
			}
			if !now.Before(dueAt) {
				d, err := k.w.Due(ctx, pc, dueSince)
				if err != nil {
					return err
				}
				if lanes := lanesOf(d.Lanes); !lanes.empty() {
					k.wakeAndTell(lanes)
				}
				if polling && seen > d.Newest && d.Newest > 0 && d.Newest != lowered {
					// Every row past d.Newest is gone: delivered, or the
					// identity was reset (TRUNCATE … RESTART IDENTITY, a
					// restore), after which new rows take ids below those
					// the looks passed, and a look for ids past seen would
					// never find them. Look again from the start: it finds
					// the rows there are now, and wakes only their lanes.
					// Once per newest id: rows that wait (a retry) below
					// the newest seen are looked at once, not every second;
					// an empty outbox needs no look (new rows take ids
					// past 0).
					k.log.Debug("outbox ids below the newest seen; looking from the start", "seen", seen, "newest", d.Newest)
					seen, lowered = 0, d.Newest
				}
				dueSince = d.Since
				dueAt = now.Add(dueEvery)
				if !d.Next.IsZero() {
					// The next row's due time, on this clock (+1ms: it is
					// due once the database's clock has passed it).
					if at := now.Add(d.Next.Sub(d.Now) + time.Millisecond); at.Before(dueAt) {
						dueAt = at
					}
				}
			}
			if polling && !now.Before(nextPoll) {
				var id int64
				var lanes laneSet
				var err error
				filled := false
				baseline := seen < 0
				// reported: the stream reported commits since the last look.
				reported := streaming && walRowsAt.After(lastLook)
				if baseline {
					id, err = k.w.NewestID(ctx, pc)
					gaps = gapList{}
				} else {
					var got store.NewRows
					got, err = k.w.NewRows(ctx, pc, seen, gaps.ids(now), gapSpan)
					id, lanes, filled = got.Newest, lanesOf(got.Lanes), len(got.GapsFilled) > 0
					gaps.fill(got.GapsFilled)
					gaps.add(max(seen, got.Newest-gapSpan), got.IDs, now)
					if streaming {
						recent.add(got.IDs, now)
						recent.add(got.GapsFilled, now)
					}
				}
				if err != nil {
					return err
				}
				if baseline {
					// Rows up to id are behind the looks from now on, and
					// a claim woken earlier may have looked before some of
					// them committed: everyone looks once more.
					k.wakeAndTell(laneSet{})
				}
				if (id > seen && seen >= 0) || filled {
					k.wake(lanes)
					if err := tell(now, payloadOf(lanes)); err != nil {
						return err
					}
					lastNotify = now
					lastRows = now
					interval = watchFast
					if !lastLook.IsZero() {
						// Rows come faster than the workers would want a
						// wake-up for each few: merge more of them per claim.
						switch rate := float64(id-seen) / now.Sub(lastLook).Seconds(); {
						case rate > watchFullRate:
							interval = watchFull
						case rate > watchBusyRate:
							interval = watchBusy
						}
					}
				} else if now.Sub(lastRows) >= watchLinger {
					interval = min(2*interval, k.cfg.WatchInterval)
				}
				found := id > seen || filled
				seen = id
				lastLook = now
				nextPoll = time.Now().Add(interval)
				if reported && !found {
					// The reported rows are not visible yet (or were
					// claimed already): look again soon, once.
					nextPoll = time.Now().Add(walRecheck)
				}
				if streaming && now.Sub(walRowsAt) >= watchLinger && now.Sub(lastRows) >= watchLinger {
					polling = false // until the stream reports rows again
				}
			}
		}

		// Wait for a notification until the next thing to do.
		var deadline time.Time
		switch {
		case !watching:
			deadline = nextElect
		case polling:
			deadline = nextPoll
			if !walAgain.IsZero() && walAgain.Before(deadline) {
				deadline = walAgain
			}
		default:
			deadline = now.Add(time.Hour) // the WAL follower kicks
		}
		if watching && dueAt.Before(deadline) {
			deadline = dueAt
		}
		if k.isPending() {
			deadline = lastNotify.Add(notifyGap)
		}
		wctx, cancel := context.WithDeadline(ctx, deadline)
		k.cancelWait.Store(&cancel)
		if (k.isPending() && time.Since(lastNotify) >= notifyGap) || k.walDone.Load() != nil {
			cancel() // kicked before the wait could be interrupted
		}
		n, err := pc.WaitForNotification(wctx)
		k.cancelWait.Store(nil)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if wctx.Err() != nil && !pc.IsClosed() {
				continue // time for the next thing to do, or kicked
			}
			return err
		}
		if n.PID == pc.PgConn().PID() {
			continue // our own: our workers were woken when it was sent
		}
		switch lanes, ok := parseLanes(n.Payload); {
		case n.Payload == store.ListenerPayload:
			// A listener started: it hears the wake-ups from now on (for
			// at least othersEvery; then the check says).
			alone, othersAt = false, time.Now().Add(othersEvery)
		case n.Payload == store.FreedPayload:
			// Lanes were handed back: the relays below their share take
			// them (the set of relays is the same).
			k.members(true)
		case n.Payload == store.MembersPayload:
			// Relays came or went (this process's own too): check again
			// before the next wake-up.
			othersAt = time.Time{}
			k.members(false)
			if !watching {
				// A relay left or was reaped: it may have been the
				// watcher, whose rows nobody watches until a follower
				// takes its lock. At most one try per rebalanceGap:
				// sixteen relays starting together send sixteen
				// notifications.
				if t := lastElect.Add(rebalanceGap); t.Before(nextElect) {
					nextElect = t
				}
			}
		case n.Payload == "":
			k.wake(laneSet{})
		case ok:
			k.wake(lanes)
		}
	}
}

// lanesOf is the set of lanes listed (those in range).
func lanesOf(ls []int16) laneSet {
	var s laneSet
	for _, l := range ls {
		if l >= 0 && int(l) < numLanes {
			s.add(int(l))
		}
	}
	return s
}

// gapList is the polling watcher's list of ids it looks for again (see
// maxGaps), newest last.
type gapList []gap

type gap struct {
	id    int64
	until time.Time
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

// addIDs records ids to look for (keeping the newest maxGaps).
func (g *gapList) addIDs(ids []int64, now time.Time) {
	for _, id := range ids {
		*g = append(*g, gap{id: id, until: now.Add(gapTTL)})
	}
	g.keepNewest()
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

// payloadOf is the NOTIFY payload about lanes ("" when empty: all lanes).
func payloadOf(lanes laneSet) string {
	if lanes.empty() {
		return ""
	}
	return lanes.payload()
}
