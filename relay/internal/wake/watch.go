package wake

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// watch is one LISTEN session's state machine (docs/design.md, "Wake-up"):
// the election of the schema's watcher and, once this session watches,
// the WAL stream, the looks for rows that came due and for new rows, and
// the NOTIFYs to the other processes. Each concern is one method that
// step calls in turn; wait and heard handle what comes in between. Only
// loop's goroutine touches it; the WAL follower talks to it through the
// Waker's atomics (walUp, walRows, walDone) and kick.
type watch struct {
	k         *Waker
	pc        *pgx.Conn
	wal, rows bool // follow the WAL; watch for new rows at all
	host      string
	pid       int

	// Election.
	watching  bool
	nextElect time.Time // when a follower next tries the lock
	lastElect time.Time // when it last tried

	// The WAL stream. streaming: it runs, and says when rows were
	// committed; the watcher then looks for them (the poll's look) at
	// once, and on the fast interval until watchLinger has passed
	// without a report or a row, then stops looking.
	streaming  bool
	walRowsAt  time.Time // the stream's last report
	walNewest  int64     // the newest id the stream reported
	walRetry   time.Duration
	walAgain   time.Time // when to try the WAL again
	walStarted time.Time
	walLogged  bool
	stopWAL    func()

	// Rows woken straight from the stream's reports (see
	// mayWakeFromStream): those waiting for walMergeGap since the last
	// such wake-up (their ids and lanes), and when to check that claims
	// returned the rows woken.
	direct     lanes.Set
	directIDs  []int64
	directAt   time.Time // the last such wake-up
	claimCheck time.Time

	// Looks for new rows.
	polling  bool
	seen     int64 // the newest id the looks have passed; -1: none yet
	interval time.Duration
	nextPoll time.Time
	lastLook time.Time // the last look for new rows
	lastRows time.Time // when a look last found new rows
	gaps     gapList
	recent   recentIDs // ids the looks found lately (WAL mode)

	// Looks for rows that came due.
	dueAt    time.Time // when to look next
	dueSince int64     // the database's clock at the last look (see store.Due)

	// NOTIFYs. alone: nobody else listens (see store.Waker.Others), so
	// the watcher's wake-ups would wake nobody and are not sent; checked
	// again before a wake-up at most every othersEvery, and at the next
	// one after a membership notification; false for othersEvery after a
	// listener said it started.
	lastNotify time.Time
	alone      bool
	othersAt   time.Time
}

func newWatch(k *Waker, pc *pgx.Conn, wal, rows bool) *watch {
	host, pid := service.ProcessIdentity()
	return &watch{k: k, pc: pc, wal: wal, rows: rows, host: host, pid: pid,
		seen: -1, interval: watchFast, walRetry: walRetryMin, stopWAL: func() {}, recent: recentIDs{}}
}

// loop waits for notifications on pc and, once this session holds the
// watcher lock, watches for rows that came due and, with rows (unless the
// writers' trigger does), for new rows: through the WAL when wal is set
// and the server allows it, else by polling.
func (k *Waker) loop(ctx context.Context, pc *pgx.Conn, wal, rows bool) error {
	w := newWatch(k, pc, wal, rows)
	w.forgetExpected() // a session before this one's
	defer func() { w.stopWAL() }()
	for {
		now := k.now()
		if err := w.step(ctx, now); err != nil {
			return err
		}
		n, err := w.wait(ctx, now)
		if err != nil {
			return err
		}
		if n != nil {
			w.heard(n)
		}
	}
}

// step does what is due at now: the election while this session does
// not watch, and every concern of the watcher while it does.
func (w *watch) step(ctx context.Context, now time.Time) error {
	if !w.watching && !now.Before(w.nextElect) {
		if err := w.elect(ctx, now); err != nil {
			return err
		}
	}
	if !w.watching {
		return nil
	}
	w.followStream(ctx, now)
	w.wakeDirect(now)
	w.checkClaims(now)
	if err := w.sendPending(ctx, now); err != nil {
		return err
	}
	if err := w.lookDue(ctx, now); err != nil {
		return err
	}
	if w.polling && !now.Before(w.nextPoll) {
		return w.lookNew(ctx, now)
	}
	return nil
}

// elect tries the watcher lock (a pooled session watches for its own
// process alone, without it) and starts watching when it got it.
func (w *watch) elect(ctx context.Context, now time.Time) error {
	k := w.k
	ok := k.pooled
	if !ok {
		var err error
		if ok, err = k.w.TryWatch(ctx, w.pc, k.s); err != nil {
			return err
		}
	}
	if !ok {
		w.lastElect = now
		w.nextElect = now.Add(k.cfg.Heartbeat)
		if w.rows {
			k.setSource("follow", false, nil)
		}
		k.cfg.Signals.Emit(testsig.Following, 0)
		return nil
	}
	w.watching = true
	k.cfg.Signals.Emit(testsig.Elected, 0)
	switch {
	case k.pooled:
		k.log.Info("connected through a transaction-pooling proxy: this process looks for new rows and rows that come due itself, without LISTEN or the watcher's lock")
		w.polling = true
		k.setSource("poll", false, nil)
	case !w.rows:
		k.log.Info("this process watches the outbox for rows that come due (retries, delayed messages) and wakes the other relays")
	case w.wal:
		k.log.Info("this process watches the outbox for new rows and wakes the other relays", "wal", w.wal)
		w.startWAL(ctx)
	default:
		k.log.Info("this process watches the outbox for new rows and wakes the other relays", "wal", w.wal)
		w.polling = true
		k.setSource("poll", false, nil)
	}
	// Rows written since the last watcher died were seen by nobody:
	// everyone looks once.
	k.wakeAndTell(lanes.Set{})
	return nil
}

// startWAL starts following the WAL in a goroutine of its own, which
// reports through the Waker's atomics.
func (w *watch) startWAL(ctx context.Context) {
	k := w.k
	walCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	k.walDone.Store(nil)
	w.walStarted = k.now()
	go func() {
		defer close(done)
		err := k.followWAL(walCtx, func(rep walReport) {
			k.walMu.Lock()
			n := min(len(rep.ids), maxGaps-len(k.walIDs))
			k.walIDs = append(k.walIDs, rep.ids[:n]...)
			k.walLns.Union(rep.lanes)
			k.walPart = k.walPart || !rep.whole || n < len(rep.ids)
			// A report the watcher has not taken yet kicked it already.
			kicked := k.walRows.Swap(true)
			k.walMu.Unlock()
			if !kicked {
				k.kick()
			}
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
	w.stopWAL = func() { cancel(); <-done }
	// Keep polling until the stream has started: rows committed before
	// the slot's consistent point are not in the stream.
	if !w.polling {
		w.polling, w.seen, w.interval, w.nextPoll = true, -1, watchFast, k.now()
	}
}

// followStream takes in what the WAL stream reported since the last step:
// it started, rows were committed, or it ended (then the watcher polls,
// and tries the WAL again later).
func (w *watch) followStream(ctx context.Context, now time.Time) {
	k := w.k
	if k.walUp.Swap(false) {
		// The stream runs: looks follow its reports from now on; everyone
		// looks once for what was committed between the last look and the
		// slot's consistent point.
		w.streaming = true
		k.streaming.Store(true)
		k.setSource("wal", false, nil)
		k.wakeAndTell(lanes.Set{})
	}
	if k.walRows.Load() {
		k.walMu.Lock()
		k.walRows.Store(false)
		ids, ls, part := k.walIDs, k.walLns, k.walPart
		k.walIDs, k.walLns, k.walPart = nil, lanes.Set{}, false
		direct := w.streaming && w.mayWakeFromStream(ids, part)
		k.walMu.Unlock()
		switch {
		case direct:
			w.wokeFromStream(now, ids, ls)
		case w.streaming:
			w.lookForReported(now, ids)
		}
	}
	if errp := k.walDone.Swap(nil); errp != nil {
		w.streamEnded(ctx, now, *errp)
	}
	if w.wal && w.polling && !w.walAgain.IsZero() && !now.Before(w.walAgain) {
		w.walAgain = time.Time{}
		w.startWAL(ctx)
	}
}

// mayWakeFromStream reports whether the watcher may wake the lanes of
// the rows the stream reported (ids, and with part some not named or
// without a lane) straight away, rather than look for the rows first: it
// is alone (the other processes' workers are woken by NOTIFYs, which go
// out after a look saw the rows), its looks have a baseline and no
// reported row above it is left for them to find, and every reported row
// is named with its lane. Called with walMu held.
func (w *watch) mayWakeFromStream(ids []int64, part bool) bool {
	return w.alone && !w.k.pooled && w.seen >= 0 && w.walNewest <= w.seen && !part && len(ids) > 0 &&
		len(w.k.expect)+len(w.directIDs)+len(ids) <= maxExpect
}

// wokeFromStream records rows the stream reported (ids) and whose lanes
// (ls) are woken straight away (see wakeDirect): the looks need not find
// them (they pass them), and checkClaims looks for those no claim
// returned, by id.
func (w *watch) wokeFromStream(now time.Time, ids []int64, ls lanes.Set) {
	for _, id := range ids {
		w.seen = max(w.seen, id)
	}
	w.walNewest = max(w.walNewest, w.seen)
	w.direct.Union(ls)
	w.directIDs = append(w.directIDs, ids...)
}

// lookForReported makes the looks find the rows the stream reported (ids,
// at most maxGaps of them) before their lanes are woken. The stream
// carries a commit as soon as its WAL record is flushed, a moment before
// the writer's transaction is visible to other sessions: a claim woken by
// the report itself could miss the row, and a claim visits only the
// lanes it was woken about. The look sees only visible rows, and keeps
// looking while reports come (a row not visible yet is found by the next
// look, or looked for again as a gap). Reports closer than notifyGap
// share a look. A reported row below the ids the looks have passed (its
// writer took its id long before it committed) is looked for by id.
// (Most reported rows below it were found by a look before their report
// came: those are not looked for again.)
func (w *watch) lookForReported(now time.Time, ids []int64) {
	for _, id := range ids {
		w.walNewest = max(w.walNewest, id)
	}
	if w.seen >= 0 {
		w.gaps.addIDs(slices.DeleteFunc(ids, func(id int64) bool { return id > w.seen || w.recent.has(id, now) }), now)
	}
	w.walRowsAt = now
	if !w.polling {
		w.polling, w.interval = true, watchFast
	}
	w.nextPoll = w.lastLook.Add(notifyGap)
}

// wakeDirect wakes the lanes of the rows the stream reported (see
// mayWakeFromStream), no sooner than walMergeGap after the last such
// wake-up.
func (w *watch) wakeDirect(now time.Time) {
	if len(w.directIDs) == 0 || now.Before(w.directAt.Add(walMergeGap)) {
		return
	}
	k := w.k
	k.walMu.Lock()
	for _, id := range w.directIDs {
		k.expect[id] = now
	}
	k.walMu.Unlock()
	k.wakeUp(w.direct)
	w.direct, w.directIDs, w.directAt = lanes.Set{}, w.directIDs[:0], now
	if w.claimCheck.IsZero() {
		w.claimCheck = now.Add(walClaimWait)
	}
}

// checkClaims looks for the rows woken straight from the stream that no
// claim of this process returned within walClaimWait of their wake-up
// (not of their report: a wake-up may wait walMergeGap): the claim looked
// before the writer's transaction was visible, or the row is in a lane
// of another process (which its look then tells), or held back behind
// its key's retry. The look finds them as reported gaps.
func (w *watch) checkClaims(now time.Time) {
	if w.claimCheck.IsZero() || now.Before(w.claimCheck) {
		return
	}
	k := w.k
	var missed []int64
	var next time.Time
	k.walMu.Lock()
	for id, at := range k.expect {
		switch {
		case !now.Before(at.Add(walClaimWait)):
			if !k.claimedLately(id) { // else claimed before it was reported
				missed = append(missed, id)
			}
			delete(k.expect, id)
		case next.IsZero() || at.Before(next):
			next = at
		}
	}
	k.walMu.Unlock()
	w.claimCheck = time.Time{}
	if !next.IsZero() {
		w.claimCheck = next.Add(walClaimWait)
	}
	if len(missed) == 0 {
		return
	}
	slices.Sort(missed)
	k.log.Debug("rows the WAL stream reported were not claimed in time; looking for them", "rows", len(missed))
	k.cfg.Signals.Emit(testsig.WALMissed, len(missed))
	if len(missed) <= maxGaps {
		w.gaps.addIDs(missed, now)
	} else {
		w.seen = min(w.seen, missed[0]-1) // too many to look for by id
	}
	w.walNewest = max(w.walNewest, missed[len(missed)-1])
	w.walRowsAt = now
	w.polling, w.interval, w.nextPoll = true, watchFast, now
}

// forgetExpected drops the rows woken straight from the stream (no stream
// runs): the looks from -1 find what is left of them.
func (w *watch) forgetExpected() {
	k := w.k
	k.streaming.Store(false)
	k.walMu.Lock()
	clear(k.expect)
	k.walMu.Unlock()
	w.direct, w.directIDs, w.claimCheck = lanes.Set{}, nil, time.Time{}
}

// streamEnded falls back to polling after the WAL stream ended with err,
// and sets when to try the WAL again.
func (w *watch) streamEnded(ctx context.Context, now time.Time, err error) {
	k := w.k
	w.streaming = false
	w.stopWAL()
	w.stopWAL = func() {}
	w.forgetExpected()
	if now.Sub(w.walStarted) > time.Minute {
		w.walRetry = walRetryMin // it ran for a while: a break, not a refusal
	}
	if walRefused(err) {
		w.walRetry = walRetryMax
	}
	lvl := slog.LevelWarn
	if k.cfg.Mode == ModeAuto && walRefused(err) {
		lvl = slog.LevelInfo // auto, and the server does not allow it: expected
		if w.walLogged {
			lvl = slog.LevelDebug
		}
	}
	w.walLogged = true
	k.log.Log(ctx, lvl, "cannot follow the WAL; polling for new rows instead", "error", err, "retry_wal_in", w.walRetry)
	k.setSource("poll", true, err)
	w.polling, w.seen, w.interval, w.nextPoll = true, -1, watchFast, now
	w.walAgain = now.Add(w.walRetry)
	w.walRetry = min(2*w.walRetry, walRetryMax)
	// Rows may have come while the stream was failing.
	k.wakeAndTell(lanes.Set{})
}

// tell sends a wake-up to the other listeners, unless there are none (or
// this session, through a proxy, cannot know).
func (w *watch) tell(ctx context.Context, now time.Time, payload string) error {
	k := w.k
	if k.pooled {
		return nil
	}
	if !now.Before(w.othersAt) {
		others, err := k.w.Others(ctx, w.pc, k.s, w.host, w.pid)
		if err != nil {
			return err
		}
		w.alone, w.othersAt = !others, now.Add(othersEvery)
	}
	if w.alone {
		return nil
	}
	return k.w.Notify(ctx, w.pc, payload)
}

// sendPending sends the NOTIFY that waits (the WAL follower's, the
// elections'), at most one per notifyGap.
func (w *watch) sendPending(ctx context.Context, now time.Time) error {
	if now.Sub(w.lastNotify) < notifyGap {
		return nil
	}
	payload, ok := w.k.takePending()
	if !ok {
		return nil
	}
	if err := w.tell(ctx, now, payload); err != nil {
		return err
	}
	w.lastNotify = now
	return nil
}

// lookDue looks, when it is time, for rows that came due (retries,
// delayed messages) and wakes their lanes; it also notices when the
// outbox's ids went below those the looks for new rows passed.
func (w *watch) lookDue(ctx context.Context, now time.Time) error {
	if now.Before(w.dueAt) {
		return nil
	}
	k := w.k
	d, err := k.w.Due(ctx, w.pc, w.dueSince)
	if err != nil {
		return err
	}
	if ls := lanes.Of(d.Lanes); !ls.Empty() {
		k.wakeAndTell(ls)
	}
	if w.seen > 0 && d.LastID > 0 && d.LastID < w.seen {
		// The identity handed out an id below the newest the looks
		// passed: it was reset (TRUNCATE … RESTART IDENTITY, a restore),
		// and a look for ids past seen would never find the new rows.
		// Look from the start again: it finds the rows there are now,
		// and wakes their lanes. (Following the WAL, the stream's reports
		// name the new ids, and the looks find them as gaps.)
		k.log.Info("the outbox's identity was reset; looking for new rows from the start", "seen", w.seen, "last_id", d.LastID)
		w.seen = 0
	}
	w.dueSince = d.Since
	step := min(k.cfg.WatchInterval, dueEvery)
	w.dueAt = onGrid(now.Add(dueEvery-step), step)
	if !d.Next.IsZero() {
		// The next row's due time, on this clock (+1ms: it is due once
		// the database's clock has passed it).
		if at := now.Add(d.Next.Sub(d.Now) + time.Millisecond); at.Before(w.dueAt) {
			w.dueAt = at
		}
	}
	return nil
}

// lookNew looks for rows committed past the newest id seen (and for the
// gaps below it), wakes their lanes here and in the other processes, and
// sets the interval of the next look by the rate rows come at.
func (w *watch) lookNew(ctx context.Context, now time.Time) error {
	k := w.k
	var id int64
	var ls lanes.Set
	var err error
	filled := false
	baseline := w.seen < 0
	// reported: the stream reported commits since the last look.
	reported := w.streaming && w.walRowsAt.After(w.lastLook)
	if baseline {
		id, err = k.w.NewestID(ctx, w.pc)
		w.gaps = gapList{}
	} else {
		var got store.NewRows
		got, err = k.w.NewRows(ctx, w.pc, w.seen, w.gaps.ids(now), gapSpan)
		id, ls, filled = got.Newest, lanes.Of(got.Lanes), len(got.GapsFilled) > 0
		w.gaps.fill(got.GapsFilled)
		w.gaps.add(max(w.seen, got.Newest-gapSpan), got.IDs, now)
		if w.streaming {
			w.recent.add(got.IDs, now)
			w.recent.add(got.GapsFilled, now)
		}
	}
	if err != nil {
		return err
	}
	if baseline {
		// Rows up to id are behind the looks from now on, and a claim
		// woken earlier may have looked before some of them committed:
		// everyone looks once more.
		k.wakeAndTell(lanes.Set{})
	}
	if (id > w.seen && w.seen >= 0) || filled {
		k.wakeUp(ls)
		if err := w.tell(ctx, now, ls.Payload()); err != nil {
			return err
		}
		w.lastNotify = now
		w.interval = w.paced(now, id)
		w.lastRows = now
	} else if now.Sub(w.lastRows) >= watchLinger {
		w.interval = min(2*w.interval, k.cfg.WatchInterval)
	} else {
		// Between the rows of a trickle: most looks find nothing.
		w.interval = min(2*w.interval, max(w.interval, watchTrickle))
	}
	found := id > w.seen || filled
	if found {
		k.cfg.Signals.Emit(testsig.FoundRows, 0)
	}
	// Every row committed past the last look was read (see caughtUp).
	whole := id-w.seen < store.NewRowsLimit
	w.seen = id
	w.lastLook = now
	w.nextPoll = k.now().Add(w.interval)
	if w.interval == k.cfg.WatchInterval {
		w.nextPoll = onGrid(k.now(), w.interval)
	}
	if reported && !found {
		// The reported rows are not visible yet (or were claimed already):
		// look again soon, once.
		w.nextPoll = k.now().Add(walRecheck)
	}
	if w.streaming && w.caughtUp(now, whole) {
		w.polling = false // until the stream reports rows again
		k.cfg.Signals.Emit(testsig.CaughtUp, 0)
	}
	return nil
}

// onGrid is the first instant after t on the grid of step d (the
// multiples of d since the zero time), on t's monotonic clock. An idle
// watcher looks on the grid of its interval: the watchers of a process's
// sources (relay.Sources) then look at the same instants, and 50 idle
// sources wake the process 10 times a second rather than 500, each time
// at another moment (the Go scheduler's wake-ups and futexes were a
// third of an idle source's cost). Looks are no farther apart than
// without it.
func onGrid(t time.Time, d time.Duration) time.Time {
	return t.Add(t.Truncate(d).Add(d).Sub(t))
}

// caughtUp reports whether the looks, while the WAL stream runs, have
// found what it reported: every reported row seen (the newest reported id
// passed, by a look that read every row past the one before, and no
// reported row below it still looked for), so the next look can wait for
// the next report. Rows that committed meanwhile are in a report of
// their own. Otherwise the looks stop once neither a report nor a row has
// come for watchLinger (a reported row claimed and deleted before any
// look saw it, say).
func (w *watch) caughtUp(now time.Time, whole bool) bool {
	if now.Sub(w.walRowsAt) >= watchLinger && now.Sub(w.lastRows) >= watchLinger {
		return true
	}
	return whole && w.seen >= w.walNewest && !w.gaps.reported(now)
}

// paced is the interval of the next look after one at now found rows up
// to id: the fast interval; longer while rows come faster than the
// workers would want a wake-up for each few (more rows merged per claim);
// and, for a trickle, half the gap since the last look that found rows,
// up to watchTrickle: rows 10 ms apart were looked for every 2 ms, 3.5
// looks a message, most of the relay's database time at 100 msg/s.
func (w *watch) paced(now time.Time, id int64) time.Duration {
	if w.lastLook.IsZero() {
		return watchFast
	}
	switch rate := float64(id-w.seen) / now.Sub(w.lastLook).Seconds(); {
	case rate > watchFullRate:
		return watchFull
	case rate > watchBusyRate:
		return watchBusy
	}
	if w.lastRows.IsZero() {
		return watchFast
	}
	return min(max(now.Sub(w.lastRows)/2, watchFast), watchTrickle)
}

// wait waits for a notification until the next thing to do (or a kick)
// and returns it; nil when the wait ended without one.
func (w *watch) wait(ctx context.Context, now time.Time) (*pgconn.Notification, error) {
	k := w.k
	var deadline time.Time
	switch {
	case !w.watching:
		deadline = w.nextElect
	case w.polling:
		deadline = w.nextPoll
		if !w.walAgain.IsZero() && w.walAgain.Before(deadline) {
			deadline = w.walAgain
		}
	default:
		deadline = now.Add(time.Hour) // the WAL follower kicks
	}
	if w.watching && w.dueAt.Before(deadline) {
		deadline = w.dueAt
	}
	if k.isPending() {
		deadline = w.lastNotify.Add(notifyGap)
	}
	if t := w.directAt.Add(walMergeGap); len(w.directIDs) > 0 && t.Before(deadline) {
		deadline = t
	}
	if !w.claimCheck.IsZero() && w.claimCheck.Before(deadline) {
		deadline = w.claimCheck
	}
	if w.idle(now) {
		k.cfg.Signals.Emit(testsig.WatcherIdle, 0)
	}
	// A timeout rather than the deadline itself: the deadline is on the
	// Waker's clock (see Waker.now).
	wctx, cancel := context.WithTimeout(ctx, deadline.Sub(k.now()))
	k.cancelWait.Store(&cancel)
	if (k.isPending() && k.now().Sub(w.lastNotify) >= notifyGap) || k.walDone.Load() != nil || k.walRows.Load() || k.walUp.Load() {
		cancel() // kicked before the wait could be interrupted
	}
	n, err := w.pc.WaitForNotification(wctx)
	k.cancelWait.Store(nil)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if wctx.Err() != nil && !w.pc.IsClosed() {
			return nil, nil // time for the next thing to do, or kicked
		}
		return nil, err
	}
	if n.PID == w.pc.PgConn().PID() {
		return nil, nil // this session's own: its workers were woken when it was sent
	}
	return n, nil
}

// idle reports whether the watcher has gone quiet: it has woken nobody
// for watchLinger (its looks for new rows, if it makes any, are backing
// off), and no NOTIFY waits.
func (w *watch) idle(now time.Time) bool {
	return w.watching && !w.k.isPending() && now.Sub(w.k.wokeAt) >= watchLinger
}

// heard acts on a notification from another session.
func (w *watch) heard(n *pgconn.Notification) {
	k := w.k
	switch ls, ok := lanes.Parse(n.Payload); {
	case n.Payload == store.ListenerPayload:
		// A listener started: it hears the wake-ups from now on (for at
		// least othersEvery; then the check says).
		w.alone, w.othersAt = false, w.k.now().Add(othersEvery)
	case n.Payload == store.FreedPayload:
		// Lanes were handed back: the relays below their share take them
		// (the set of relays is the same).
		k.cfg.Members(true)
	case n.Payload == store.MembersPayload:
		// Relays came or went (this process's own too): check again
		// before the next wake-up.
		w.othersAt = time.Time{}
		k.cfg.Members(false)
		if !w.watching {
			// A relay left or was reaped: it may have been the watcher,
			// whose rows nobody watches until a follower takes its lock.
			// At most one try per electGap: sixteen relays starting
			// together send sixteen notifications.
			if t := w.lastElect.Add(electGap); t.Before(w.nextElect) {
				w.nextElect = t
			}
		}
	case n.Payload == "":
		k.wakeUp(lanes.Set{})
	case ok:
		k.wakeUp(ls)
	}
}
