package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/settle"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// worker is one worker's loop and its state: it claims a batch, hands it
// to a goroutine that publishes and settles it (see flight), and claims
// the next one from its other lanes while up to Config.Pipeline batches
// are in flight. Only its own goroutine touches it, except the fields
// said to be shared.
type worker struct {
	r   *Relay
	id  int
	log *slog.Logger

	// Shared with the wake-up, the leaser, the breaker and the health
	// checks. wake wakes the loop; pend is what woke it since its claims
	// last took it (see lanes.Pending); lastLoop is when its loop last
	// turned (unix nanos, see Relay.Live); connWait is when it started
	// waiting for the connection it still does not have (unix nanos, 0
	// while it has one or is idle; see Relay.starved).
	wake     chan struct{}
	pend     lanes.Pending
	lastLoop atomic.Int64
	connWait atomic.Int64

	// The loop's own.
	ctx, hard context.Context
	bo        *backoff.ExponentialBackOff
	// priority: the last claim saw priority messages in the worker's
	// lanes (true until the first claim says otherwise).
	priority bool
	// rotation is the lane the next claim starts at (see nextRotation).
	rotation int
	flying   []*flight
	done     chan *flight
	// claimNow: claim as soon as the pipeline allows. besideEmpty: a
	// claim beside batches in flight found nothing, and nothing woke the
	// worker since: the next claim waits for them (one hot key would
	// otherwise cost an empty claim per batch). overlap: the sink took a
	// good part of the last batch's time (see sinkBound).
	claimNow, besideEmpty, overlap bool
	// full: the next claim visits every lane of the worker, not only the
	// lanes wake-ups named (see pending): at the start, after the safety
	// poll or an error, after a claim of every lane that may have left
	// rows behind or passed over lanes in flight, and when a wake-up
	// named no lanes; and at least every fullEvery (lastFull: the last
	// such claim).
	full     bool
	lastFull time.Time
	// held: the worker claims nothing while the schema needs a newer
	// relay (see watchSchema).
	held bool
	// parked: a published batch whose settlement waits, its transaction
	// open on its connection, to go out with the worker's next claim on
	// that connection: settle, COMMIT, BEGIN and claim in one round trip
	// instead of two (at 100 msg/s each message was a batch of its own,
	// and each round trip is a wake-up of the relay and of its backend).
	// At most one; settled alone once it has waited settleLinger (see
	// settleParked).
	parked *flight
	// gate: the outage breaker let no claim through; the worker waits
	// for it as wait says (see breaker).
	gate admission
	// chainOff: until then, no claim settles the batch before it (see
	// chain). lastSend: how long the send of the last batch that ended
	// took.
	chainOff time.Time
	lastSend time.Duration
}

// next is what a worker's loop does after a claim.
type next int

const (
	claimAgain next = iota // claim again, without waiting
	waitNext               // wait for a batch to end or a wake-up
	stop                   // the relay is stopping
)

func newWorker(r *Relay, id int) *worker {
	return &worker{r: r, id: id, log: r.log.With("worker", id), wake: make(chan struct{}, 1), priority: true}
}

// run runs the worker's loop until ctx ends, then lets the batches in
// flight finish (they run on hard).
func (w *worker) run(ctx, hard context.Context) {
	r, id := w.r, w.id
	w.ctx, w.hard, w.bo = ctx, hard, service.ReconnectBackoff()
	w.rotation, w.done, w.claimNow, w.full = id, make(chan *flight, r.cfg.Pipeline), true, true
	defer func() {
		for range w.flying {
			if f := <-w.done; f.parked {
				r.settleParked(hard, f)
			}
		}
		w.settleParked()
	}()
	for ctx.Err() == nil {
		w.lastLoop.Store(time.Now().UnixNano())
		if r.schemaErr.Load() != nil && len(w.flying) == 0 {
			w.settleParked()
			// Claim nothing on a schema this relay does not know.
			if !w.held {
				w.held = true
				r.cfg.sig.Emit(testsig.SchemaHold, id)
			}
			service.Sleep(ctx, r.cfg.PollInterval)
			continue
		}
		w.held = false
		if w.claimNow && r.schemaErr.Load() == nil && (len(w.flying) == 0 || w.overlap && !w.besideEmpty && w.roomBeside()) {
			if w.gate = r.brk.admit(id); w.gate.ok {
				switch w.claim(w.gate.probe) {
				case stop:
					return
				case claimAgain:
					continue
				}
			}
		}
		if !w.wait() {
			return
		}
	}
}

// claim claims a batch (from the lanes wake-ups named, or all of the
// worker's; probe: one message, see breaker) and sends it on its way.
func (w *worker) claim(probe bool) next {
	r := w.r
	w.claimNow = false
	busy := busyLanes(w.flying)
	woken, all := w.pend.Take(busy)
	var only []int16 // nil: every lane
	if !w.full && !all && !w.priority && time.Since(w.lastFull) < fullEvery {
		only = woken.List()
	}
	w.full = false
	if only == nil {
		w.lastFull = time.Now()
	}
	if only != nil && len(only) == 0 {
		// What woke the worker was taken by a claim since, or is in a
		// batch in flight (pending until it ends).
		return claimAgain
	}
	beside := len(w.flying) > 0
	limit := r.cfg.BatchSize
	if r.limiter != nil {
		// A batch waits for its share of the rate (see publish): no more
		// than a burst at once.
		limit = min(limit, r.cfg.RateBurst)
	}
	if probe {
		limit = 1
	}
	share := r.cfg.share
	if share != nil {
		// The source's part of the batches of a Sources (see
		// SourcesConfig.Batches): a batch under way until its sink
		// answered (see fly).
		if share.Acquire(w.ctx) != nil {
			return stop
		}
	}
	f, err := w.begin(limit, busy, only, probe)
	if share != nil && f == nil {
		share.Release(true)
	}
	if errors.Is(err, errClaimAgain) {
		w.claimNow, w.full = true, true
		return claimAgain
	}
	w.rotation = nextRotation(w.rotation, r.cfg.Workers, f)
	if only == nil {
		for _, o := range w.flying {
			o.passed = true // this claim skipped its lanes
		}
	}
	switch {
	case err != nil:
		if probe {
			r.brk.abandon()
		}
		if w.ctx.Err() != nil {
			return stop
		}
		r.handoverMayGoOn()
		w.backOff(err)
		w.claimNow, w.full = true, true
		return claimAgain
	case f != nil:
		f.probe = probe
		// A probe's settlement decides the breaker: not kept waiting. A
		// cut batch's transaction holds rows it did not return, of lanes
		// that a claim on another session would wait for. Through a
		// transaction-pooling proxy an open transaction holds one of its
		// few server connections (see parks).
		f.park = !probe && !f.cut && r.parks()
		w.fly(f)
		if f.more {
			if only != nil {
				// What it left is in the lanes it visited.
				w.pend.Add(woken)
			} else {
				w.full = true
			}
		}
		w.claimNow = f.more
		return claimAgain
	}
	if probe {
		r.brk.landed(w.id, true, foundNothing, nil)
	}
	return w.claimedNothing(beside)
}

// fly sends f to be published and settled beside the worker's loop.
func (w *worker) fly(f *flight) {
	w.flying = append(w.flying, f)
	go func() {
		f.err = w.r.finish(w.hard, f)
		if m := w.r.cfg.share; m != nil {
			m.Release(false) // its settlement may wait for the next claim
		}
		w.done <- f
	}()
}

// claimedNothing follows an empty claim (beside: made beside batches in
// flight).
func (w *worker) claimedNothing(beside bool) next {
	r := w.r
	w.besideEmpty = beside
	w.bo.Reset()
	r.handoverMayGoOn()
	if len(w.flying) == 0 && r.leftover.Load() {
		// Nobody makes copies for this route any more: once none are
		// left, none will appear.
		if left, err := r.leftoverSrc.CopiesLeft(w.ctx, r.pool); err == nil && !left && r.leftover.CompareAndSwap(true, false) {
			w.log.Info("earlier fan-out copies all delivered; reading the outbox")
			r.wakeAll() // the other workers may be idle until their next poll
			w.claimNow, w.full = true, true
			return claimAgain
		}
	}
	return waitNext
}

// wait waits for a batch to end, or for a wake-up. What was not in the
// worker's lanes when its last claim visited them all is newer, and the
// watcher wakes the worker for it, as for a retry that comes due (a claim
// straight away would find nothing at low rates: one empty transaction
// per message). It returns false when the relay is stopping.
func (w *worker) wait() bool {
	r := w.r
	var poll, sinkSlow, probe <-chan time.Time
	var t *time.Timer
	gate := w.gate
	w.gate = admission{}
	switch {
	case gate.changed != nil:
		// The breaker is open: claim when it lets the worker through.
		if !gate.at.IsZero() {
			t = time.NewTimer(time.Until(gate.at))
			probe = t.C
		}
	case len(w.flying) == 0:
		t = time.NewTimer(r.cfg.PollInterval)
		poll = t.C
	case w.claimNow && !w.overlap && !w.besideEmpty && len(w.flying) < r.cfg.Pipeline:
		// The last batch's sink took little of its time, but this one's
		// may not: once it has been with the sink for as long as its claim
		// took, claim beside it (a slow receiver, a sink's outage: the
		// other lanes need not wait for it).
		f := w.flying[len(w.flying)-1]
		t = time.NewTimer(time.Until(f.claimed.Add(f.ev.ClaimDuration)))
		sinkSlow = t.C
	}
	var linger <-chan time.Time
	if w.parked != nil {
		if len(r.handoverLanes()) > 0 {
			// Its lanes may be among those the leaser hands over.
			w.settleParked()
			return true
		}
		lt := time.NewTimer(time.Until(w.parked.oldest().Add(r.linger())))
		defer lt.Stop()
		linger = lt.C
	}
	var ended *flight
	select {
	case <-linger:
		w.settleParked()
	case <-w.ctx.Done():
	case ended = <-w.done:
	case <-w.wake:
		w.claimNow, w.besideEmpty = true, false
	case <-poll:
		w.claimNow, w.besideEmpty, w.full = true, false, true
	case <-sinkSlow:
		w.overlap = true
	case <-gate.changed:
	case <-probe:
	}
	if t != nil {
		t.Stop()
	}
	if ended == nil {
		return true
	}
	return w.landed(ended)
}

// landed follows the end of batch f. It returns false when the relay is
// stopping.
func (w *worker) landed(f *flight) bool {
	r := w.r
	w.flying = slices.DeleteFunc(w.flying, func(o *flight) bool { return o == f })
	r.handoverMayGoOn()
	if errors.Is(f.err, errDestinationDown) {
		// The breaker waits (see breaker), not the worker.
		r.brk.landed(w.id, f.probe, foundDown, f.err)
		w.claimNow, w.full = true, true
		return w.ctx.Err() == nil
	}
	if f.err != nil {
		if f.probe {
			r.brk.abandon()
		}
		if w.ctx.Err() != nil {
			return false
		}
		w.backOff(f.err)
		w.claimNow, w.full = true, true
		return true
	}
	r.brk.landed(w.id, f.probe, wentThrough, nil)
	if f.parked {
		w.park(f)
	}
	if d, cause := slowDown(f.batch, f.ev.SendErr); d > 0 && r.dests == nil {
		r.brk.pause(d)
		r.strain.paused(time.Now().Add(d), cause)
	}
	w.bo.Reset()
	w.overlap = f.sinkBound()
	w.lastSend = f.ev.SendDuration
	// Claim again when the batch's claim may have left some behind, a
	// later claim of every lane passed over its lanes, or a wake-up named
	// them while it held them.
	w.full = w.full || f.passed
	w.claimNow = w.claimNow || f.more || f.passed || w.pend.Waiting(busyLanes(w.flying))
	return true
}

// backOff waits after a failed cycle (a batch parked meanwhile is
// settled first: its lanes stay locked until then).
func (w *worker) backOff(err error) {
	w.settleParked()
	d := w.bo.NextBackOff()
	if errors.Is(err, errNothingAttempted) {
		// The next claim may find the sink ready (it stopped early, or
		// waited for its own rate limit): not the database's reconnect
		// pace.
		d = min(d, time.Second)
	}
	w.log.Warn("batch failed; retrying", "error", err, "retry_in", d)
	w.r.cfg.Hooks.CycleError(err)
	service.Sleep(w.ctx, d)
}

// roomBeside reports whether the worker may claim another batch beside
// those in flight (at least one).
func (w *worker) roomBeside() bool {
	r, flying := w.r, w.flying
	if len(flying) >= r.cfg.Pipeline {
		return false
	}
	for _, f := range flying {
		if f.cut {
			// Its transaction holds rows of lanes it did not return: a
			// claim of those would wait for it.
			return false
		}
	}
	if w.parked != nil {
		// The claim goes out on the parked batch's session: no second
		// connection. (Counted against the pool, parked sessions held
		// back the claims beside slow batches: commit-to-sink p99 at
		// 1,000 msg/s, quick latency runs, median 101 ms of 12 against
		// 43 ms of 4 with this, 56 ms of 4 for the release before.)
		return true
	}
	// A second connection only while the pool has one to spare beyond
	// health checks and metrics (a --max-conns below what pipelining
	// needs leaves each worker one batch at a time).
	st := r.pool.Stat()
	return st.AcquiredConns()+1 < st.MaxConns()
}

// errNothingAttempted: the sink tried none of a batch's messages and
// said nothing about why (see down).
var errNothingAttempted = errors.New("outbox: sink attempted nothing")

// flight is a claimed batch on its way: its transaction is open on conn
// until finish publishes and settles it.
type flight struct {
	conn  *pgxpool.Conn
	src   *source
	batch []claim.Row
	ev    BatchEvent
	// more: the claim may have left messages behind in the worker's lanes
	// (see claim); cut: its transaction holds rows it did not return.
	more, cut bool
	// passed: a later claim ran while this batch was in flight, skipping
	// its lanes (set and read by the worker's loop only).
	passed bool
	// probe: the batch is the outage breaker's probe (see breaker).
	probe bool
	// park: once published, its settlement may wait for the worker's
	// next claim (see worker.parked); parked: finish left it so, its
	// transaction open, with settlement to be carried out, since
	// parkedAt.
	park, parked bool
	settlement   settle.Settlement
	parkedAt     time.Time
	// claimed is when the claim returned (ev.ClaimDuration, set before
	// the batch goes to finish, says how long it took).
	claimed time.Time
	err     error
	// riders are earlier batches of the worker, all delivered, whose
	// rows the claims of this transaction deleted (see worker.chain),
	// oldest first: settled when it commits, or delivered again if it
	// does not. foldedAt: when the claim that deleted this batch's rows
	// went out (once it rides).
	riders   []*flight
	foldedAt time.Time
	// riderLanes are the lanes of riders, as the claim left them (read
	// by the worker's loop while the batch is in flight: see busyLanes).
	riderLanes lanes.Set
}

// oldest is when the oldest delivered batch of f's transaction was
// parked: its riders', or f's own.
func (f *flight) oldest() time.Time {
	if len(f.riders) > 0 {
		return f.riders[0].parkedAt
	}
	return f.parkedAt
}

// sinkBound reports whether the sink took at least a third of the time
// of f's batch (its send against its claim and settlement): only then
// does a second batch in flight have the database's time to use. When
// the database is the bound (a sink that costs nothing, the fan-out
// router, many relays on a saturated server), more batches in flight
// only add sessions competing for it: measured with 4 and 16 relays
// started together into discard, -10 to -27 %.
func (f *flight) sinkBound() bool {
	return 2*f.ev.SendDuration >= f.ev.ClaimDuration+f.ev.SettleDuration
}

// fullEvery: a worker that claims only the lanes wake-ups named still
// visits all of its lanes at least this often while it is woken, for a row
// no wake-up named (a writer's transaction that took its id long before
// it committed, so that the polling watcher's look for new ids passed it):
// before, any wake-up's claim visited every lane and found such a row
// within milliseconds while others were written.
const fullEvery = time.Second

// busyLanes is the set of the lanes of the batches in flight, and of
// those riding in their transactions: their rows are deleted there, not
// yet committed, and a claim on another session would wait for them.
func busyLanes(flying []*flight) lanes.Set {
	s := lanesOf(flying)
	for _, f := range flying {
		s.Union(f.riderLanes)
	}
	return s
}

// lanesOf is the set of the lanes of the batches fs.
func lanesOf(fs []*flight) lanes.Set {
	var s lanes.Set
	for _, f := range fs {
		for i := range f.batch {
			s.Add(int(f.batch[i].Lane))
		}
	}
	return s
}

// nextRotation is the lane the worker's next claim starts at, after a
// claim that started at rotation and returned f. A claim that filled its
// batch stopped at the lane of its last row: the next one goes on after
// it, so every lane still gets its turn (round robin), and the lanes the
// claim found empty are not probed again before the others have had
// theirs. Each probe of an emptied lane walks its index over the rows
// deleted from it (measured, about 60 µs each on a drained 200k backlog),
// so a rotation that moved one lane per claim while each claim emptied
// more than one made the claims of a backlog's end walk a growing run of
// empty lanes: up to all of the worker's, 8 ms a claim.
func nextRotation(rotation, workers int, f *flight) int {
	if f != nil && f.more && len(f.batch) > 0 {
		return (int(f.batch[len(f.batch)-1].Lane) + workers) % lanes.N
	}
	return (rotation + workers) % lanes.N
}

// begin claims a batch in a transaction it leaves open, from the lanes
// only (nil: every lane of the worker), skipping the lanes being handed
// over and busy (those of the batches in flight). It claims on the
// session of the worker's parked batch, whose settlement and COMMIT go
// ahead of the claim in the same round trip, or else on a connection it
// acquires. A claim that finds nothing returns a nil flight, its empty
// transaction parked in turn (its COMMIT goes with the next claim).
func (w *worker) begin(limit int, busy lanes.Set, only []int16, probe bool) (_ *flight, err error) {
	r, hard := w.r, w.hard
	start := time.Now()
	prev := w.parked
	w.parked = nil
	conn, err := w.session(prev)
	if err != nil {
		return nil, err
	}
	// From here on the batch belongs to the hard context: a drain lets it
	// finish.
	pc := conn.Conn()
	open := true
	defer func() {
		if open {
			release(hard, conn, err)
		}
	}()
	skip := r.handoverLanes()
	if !busy.Empty() {
		// Shared with the leaser: never appended to.
		skip = append(slices.Clone(skip), busy.List()...)
	}
	src := r.source()
	visit := only
	if visit == nil {
		visit = r.lease.Owned().Of(w.id, r.cfg.Workers)
	}
	cb := &pgx.Batch{}
	var settling *settle.Pending
	a := claimArgs{limit: limit, skip: skip, only: visit, probe: only == nil}
	var riders []*flight
	if prev != nil {
		if a.settle, a.chained = w.chain(prev, src, probe, limit); a.chained {
			riders = prev.ridersAfter(start)
			// The transaction holds no more rows than a batch: what a
			// relay killed in it delivers again stays a batch's worth.
			a.limit -= rowsOf(riders)
		} else {
			settling = r.settler.Queue(cb, prev.src.Engine, prev.batch, prev.settlement, prev.ev.SendErr)
		}
	}
	batch, more, cut, err := w.claimRows(pc, cb, src, a)
	if a.chained && err == nil && len(a.settle) > 0 {
		r.cfg.sig.Emit(testsig.Chained, w.id)
	}
	if a.chained && err != nil {
		// The transaction failed: so did the deletes of the batches that
		// rode in it (delivered again: the at-least-once bound).
		r.ridersSettled(riders, err)
		if settle.Refused(err) {
			// A row the claim's DELETE cannot remove (a trigger, a
			// constraint): settle alone for a while, where a refused
			// settlement goes row by row.
			w.chainOff = time.Now().Add(chainOffFor)
		}
	}
	if settling != nil {
		if again, serr := w.settledAhead(prev, settling, err); serr != nil || again {
			open = false
			release(hard, conn, serr)
			if serr != nil {
				return nil, serr
			}
			return nil, errClaimAgain
		}
	}
	r.stats.Claims.Add(1)
	if only != nil {
		r.stats.LaneClaims.Add(1)
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if len(batch) == 0 {
		r.stats.EmptyClaims.Add(1)
		if !r.parks() {
			if _, err = pc.Exec(hard, "COMMIT"); err != nil {
				return nil, fmt.Errorf("outbox: commit: %w", err)
			}
			return nil, nil // released by the deferred release
		}
		open = false
		w.parked = &flight{conn: conn, src: src, claimed: now, parkedAt: now, riders: riders}
		return nil, nil
	}
	r.stats.Claimed.Add(int64(len(batch)))
	r.claimed(batch)
	open = false
	return &flight{conn: conn, src: src, batch: batch, more: more, cut: cut, claimed: now, riders: riders, riderLanes: lanesOf(riders),
		ev: BatchEvent{Worker: w.id, Claimed: len(batch), ClaimDuration: now.Sub(start)}}, nil
}

// chain decides whether the worker's next claim, from src, goes on in
// the open transaction of its parked batch prev, deleting prev's rows in
// its own statement (settle; see store.ClaimParams.Settle), rather than
// after prev's DELETE and COMMIT: at live rates a batch is a message or
// a few, and its DELETE was a statement a message. The transaction then
// spans batches, and ends (its COMMIT with a settlement, see
// flight.riders) once its oldest delivered batch has waited
// settleLinger, like a parked batch, or with the settlement of the batch
// it claims. What a relay killed meanwhile delivers again is no more
// than a batch's worth of rows, since the claim takes fewer by as many
// (a backlog's full batches do not chain; limit is the claim's). Only
// while sends are quick (see chainSendMax). Not for the breaker's probe,
// a claim with a priority phase, the fan-out router or the archive
// (their settlements have no such form), while the leaser hands lanes
// over (they wait for the transaction), nor for a while after the
// database refused such a claim (see chainOff).
func (w *worker) chain(prev *flight, src *source, probe bool, limit int) (settle []pgtype.TID, ok bool) {
	r := w.r
	if probe || w.priority || prev.src != src || time.Since(prev.oldest()) >= r.linger() || time.Now().Before(w.chainOff) ||
		len(r.handoverLanes()) > 0 || rowsOf(prev.riders)+len(prev.batch) >= limit ||
		r.limiter != nil || w.lastSend > chainSendMax {
		return nil, false
	}
	if len(prev.batch) == 0 {
		// An empty claim's transaction: worth going on only for the
		// batches riding in it.
		return nil, len(prev.riders) > 0
	}
	return r.settler.Foldable(src.Engine, prev.settlement)
}

// chainSendMax: a worker chains claims (see chain) only while its last
// batch's send took at most this long. The batches riding in a
// transaction commit with the settlement of the batch it claims next,
// after that batch's send: a slow sink (or a rate limit's wait, which
// never chains) would keep them uncommitted, and so to be delivered
// again by a relay killed meanwhile, for as long as it takes.
const chainSendMax = 10 * time.Millisecond

// rowsOf counts the rows of the batches fs.
func rowsOf(fs []*flight) int {
	n := 0
	for _, f := range fs {
		n += len(f.batch)
	}
	return n
}

// chainOffFor is how long a worker settles alone after the database
// refused a claim that settled the batch before it (see chain).
const chainOffFor = time.Minute

// ridersAfter returns the batches riding in f's transaction once a claim
// (sent at) deleted f's rows in it: f's riders and f itself.
func (f *flight) ridersAfter(at time.Time) []*flight {
	riders := f.riders
	f.riders = nil
	if len(f.batch) > 0 {
		f.foldedAt = at
		riders = append(riders, f)
	}
	return riders
}

// ridersSettled reports the end of the transaction the batches riders
// rode in (see flight.riders): err is nil when it committed, and their
// rows with it.
func (r *Relay) ridersSettled(riders []*flight, err error) {
	for _, f := range riders {
		r.parkedSettled(f, settle.Result{Settled: f.settlement, Duration: time.Since(f.foldedAt)}, err)
	}
}

// session returns the connection of the worker's next claim: that of its
// parked batch prev, or one acquired from the pool.
func (w *worker) session(prev *flight) (*pgxpool.Conn, error) {
	r := w.r
	if prev != nil {
		if r.schemaErr.Load() == nil {
			return prev.conn, nil
		}
		r.settleParked(w.hard, prev)
		return nil, errClaimAgain
	}
	start := time.Now()
	w.connWait.CompareAndSwap(0, start.UnixNano())
	conn, err := r.pool.Acquire(w.ctx)
	if err != nil {
		// Still without a connection (through the backoff too): see
		// starved.
		return nil, fmt.Errorf("outbox: acquire connection: %w", err)
	}
	w.connWait.Store(0)
	if r.schemaErr.Load() != nil {
		// The schema outgrew this relay while the worker waited for the
		// connection: claim nothing.
		conn.Release()
		return nil, errClaimAgain
	}
	if !r.pooled {
		if err := store.PrepareClaims(w.hard, conn.Conn()); err != nil {
			release(w.hard, conn, err)
			return nil, fmt.Errorf("outbox: claim session: %w", err)
		}
	}
	return conn, nil
}

// settledAhead reports the settlement of prev that went ahead of a claim
// in one round trip (claimErr: that round trip's error). It returns the
// settlement's error (the session is then given up), or again when the
// database refused the settlement as a whole: it was carried out row by
// row, and the claim behind it did not run.
func (w *worker) settledAhead(prev *flight, settling *settle.Pending, claimErr error) (again bool, _ error) {
	r := w.r
	res, err := settling.Done(w.hard, prev.conn.Conn(), claimErr)
	r.parkedSettled(prev, res, err)
	r.handoverMayGoOn()
	return err == nil && !settling.Committed(), err
}

// finish publishes f's batch (or, for the fan-out router, routes it to
// its destinations), settles it in its transaction and commits it; it
// then releases the connection. A nil error means the transaction
// committed, or that f is parked: its settlement waits, with its
// connection, for the worker's next claim (see worker.parked).
func (r *Relay) finish(hard context.Context, f *flight) (err error) {
	n := int64(len(f.batch))
	r.inFlight.Add(n)
	var s settle.Settlement
	if f.src.router() {
		s = settle.Route(f.batch, r.cfg.routesOf)
	} else if s, err = r.publish(hard, f.batch, f.probe, &f.ev); err != nil {
		r.inFlight.Add(-n)
		r.abandon(hard, f, err)
		return err
	}
	f.settlement = s
	// Only a batch delivered whole waits: a failure's settlement decides
	// what the route's state, its logs and its hooks say next.
	if delivered, _, _, _ := s.Counts(); f.park && delivered == len(f.batch) && hard.Err() == nil && len(r.handoverLanes()) == 0 {
		f.parked = true
		return nil
	}
	return r.settleParked(hard, f)
}

// abandon ends f's transaction after its batch failed to publish (err):
// its rows go back untouched. When batches ride in it (see
// flight.riders), delivered and deleted there, it commits for them
// instead of rolling back: its own rows are only locked in it.
func (r *Relay) abandon(hard context.Context, f *flight, err error) {
	if riders := f.riders; len(riders) > 0 {
		f.riders = nil
		ctx, cancel := context.WithTimeout(context.WithoutCancel(hard), 5*time.Second)
		var tag pgconn.CommandTag
		if tag, err = f.conn.Conn().Exec(ctx, "COMMIT"); err == nil && tag.String() != "COMMIT" {
			// An aborted transaction answers COMMIT with ROLLBACK.
			err = errors.New("outbox: the transaction was rolled back")
		}
		cancel()
		r.ridersSettled(riders, err)
	}
	release(hard, f.conn, err)
}

// settleParked settles f's batch alone in its transaction, commits it
// and releases its connection. A nil error means the transaction
// committed.
func (r *Relay) settleParked(hard context.Context, f *flight) error {
	f.parked = false
	res, err := r.settler.Settle(hard, f.conn.Conn(), f.src.Engine, f.batch, f.settlement, f.ev.SendErr)
	r.parkedSettled(f, res, err)
	release(hard, f.conn, err)
	return err
}

// parkedSettled reports the settlement of f, a batch finish counted in
// flight (alone or ahead of a claim); an empty claim's transaction, with
// no batch, is no batch to report.
func (r *Relay) parkedSettled(f *flight, res settle.Result, err error) {
	if riders := f.riders; len(riders) > 0 {
		f.riders = nil
		if err == nil && res.Apart {
			err = errRolledBackForApart
		}
		r.ridersSettled(riders, err)
	}
	r.inFlight.Add(-int64(len(f.batch)))
	if len(f.batch) > 0 {
		r.settled(&f.ev, res, err)
	}
}

// settleLinger is how long a published batch's settlement waits for the
// worker's next claim to go out with (see worker.parked) before it goes
// alone. Rows of a trickle come a few milliseconds apart to each worker;
// meanwhile the batch's rows stay in the outbox, locked, and a relay
// killed then delivers them again (the at-least-once bound, longer by
// this much).
const settleLinger = 50 * time.Millisecond

// linger is how long the relay's settlements wait for a next claim:
// settleLinger, unless a test set another.
func (r *Relay) linger() time.Duration {
	if r.cfg.linger > 0 {
		return r.cfg.linger
	}
	return settleLinger
}

// parks reports whether the relay's batches wait for the next claim to
// settle with (see worker.parked): not through a transaction-pooling
// proxy, where each open transaction holds one of the proxy's few server
// connections (two relays through a PgBouncer of 2 stalled on it).
func (r *Relay) parks() bool { return !r.pooled }

// park keeps f (published, parked by finish) for the worker's next
// claim; a batch parked before it is settled now.
func (w *worker) park(f *flight) {
	w.settleParked()
	f.parkedAt = time.Now()
	w.parked = f
}

// settleParked settles the worker's parked batch, if any, alone.
func (w *worker) settleParked() {
	f := w.parked
	if f == nil {
		return
	}
	w.parked = nil
	if err := w.r.settleParked(w.hard, f); err != nil && w.ctx.Err() == nil {
		// Its messages are delivered again (the at-least-once bound); the
		// next claim, on another session, finds out whether the database
		// is there.
		w.log.Warn("settling a batch failed", "error", err)
		w.r.cfg.Hooks.CycleError(err)
		w.claimNow, w.full = true, true
	}
	w.r.handoverMayGoOn()
}

// errRolledBackForApart: the transaction that the batches riding in it
// (see flight.riders) needed was rolled back so that a settlement the
// database refused went row by row (see settle.Result.Apart): their messages
// are delivered again.
var errRolledBackForApart = errors.New("outbox: transaction rolled back to settle a refused batch row by row")

// errClaimAgain: the settlement that went ahead of a claim was refused
// and carried out row by row (see settle.Pending), so the claim did not
// run: the worker claims again at once.
var errClaimAgain = errors.New("outbox: claim again")

// settled reports a batch's settlement (err: its transaction did not
// commit) to the relay's totals, its strain and Hooks.Batch, with ev,
// which holds what the claim and the send recorded.
func (r *Relay) settled(ev *BatchEvent, res settle.Result, err error) {
	s := &res.Settled
	ev.Delivered, ev.Retried, ev.DeadLettered, ev.Untouched = s.Counts()
	ev.DeadReasons = s.DeadReasons()
	ev.DeliveredMessages = s.DeliveredOf(ev.Messages)
	ev.SettleDuration = res.Duration
	ev.Committed = err == nil
	r.stats.Batches.Add(1)
	defer r.cfg.Hooks.Batch(*ev)
	if err != nil {
		r.stats.CommitFailures.Add(1)
		return
	}
	if failed := s.Failed(); failed > 0 || ev.Delivered > 0 {
		r.strain.settled(failed, settle.FirstFailure(ev.SendErr))
	}
	r.stats.Delivered.Add(int64(ev.Delivered))
	r.stats.Retried.Add(int64(ev.Retried))
	r.stats.DeadLettered.Add(int64(ev.DeadLettered))
}

// release ends a batch's use of conn: it rolls back a transaction err
// left open and returns the connection to the pool.
func release(hard context.Context, conn *pgxpool.Conn, err error) {
	if err != nil {
		rollback(hard, conn.Conn())
		// A session that cannot write (it started on a read-only or
		// standby server) stays that way: close it so that the pool opens
		// a new one instead of handing it out again.
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "25006" {
			_ = conn.Conn().Close(context.WithoutCancel(hard))
		}
	}
	conn.Release()
}

// handoverMayGoOn tells the leaser, while it is handing lanes over, that
// a claim transaction of this worker ended: the batch that held a lane
// being handed over may have been this one, and the lane can go now.
func (r *Relay) handoverMayGoOn() {
	if len(r.handoverLanes()) > 0 {
		r.lease.MembersChanged()
	}
}

// handoverLanes are the lanes the leaser is giving up: not to be claimed.
func (r *Relay) handoverLanes() []int16 {
	if h := r.lease.HandingOver(); h != nil {
		return h
	}
	return []int16{}
}

// rollback ends the claim's transaction on pc when it did not commit.
func rollback(hard context.Context, pc *pgx.Conn) {
	if pc.IsClosed() {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(hard), 5*time.Second)
	defer cancel()
	if _, err := pc.Exec(rctx, "ROLLBACK"); err != nil {
		// The session's state is unknown: do not reuse it.
		_ = pc.Close(rctx)
	}
}

// publish hands a claimed batch to the sink and decides, from its
// answer, the batch's settlement; ev holds what the claim knows, and
// publish records the send in it.
func (r *Relay) publish(hard context.Context, batch []claim.Row, probe bool, ev *BatchEvent) (settle.Settlement, error) {
	if r.limiter != nil {
		// The rows stay locked in the claim's transaction meanwhile, as
		// they would while a slow sink takes them.
		if err := r.waitRate(hard, len(batch)); err != nil {
			return settle.Settlement{}, fmt.Errorf("outbox: waiting for the rate limit: batch rolled back: %w", err)
		}
	}
	var pre []error
	var probes map[string]bool
	if r.dests != nil {
		pre, probes = r.dests.gate(batch)
	}
	r.send(hard, batch, pre, ev)
	if hard.Err() != nil {
		// Drain deadline passed mid-publish: roll back so the messages come
		// back untouched (some may be delivered twice, never lost).
		if r.dests != nil {
			r.dests.abandon(probes)
		}
		return settle.Settlement{}, fmt.Errorf("outbox: drain timeout during publish: batch rolled back: %w", hard.Err())
	}
	if r.dests != nil {
		// Each destination has its outage (see destinations), not the
		// route.
		ev.SendErr = r.dests.judge(batch, ev.SendErr, probes, r.confirmer(hard))
		return settle.Decide(batch, ev.SendErr, r.rules), nil
	}
	switch v, cause := down(batch, ev.SendErr, probe, r.confirmer(hard)); v {
	case isDown:
		// Nothing got through, and nothing failed on its own: roll the
		// batch back untouched (no attempt counted) and let the breaker
		// probe the destination (see breaker).
		return settle.Settlement{}, fmt.Errorf("%w: none of %d messages got through: %w", errDestinationDown, len(batch), cause)
	case untouched:
		// The sink tried nothing and said nothing about the destination
		// (it broke off, or breaks the contract): claiming the same batch
		// again at once would spin. Release it and let the worker back
		// off.
		return settle.Settlement{}, fmt.Errorf("%w: none of %d messages: %w", errNothingAttempted, len(batch), cause)
	}
	return settle.Decide(batch, ev.SendErr, r.rules), nil
}

// confirmer returns how publish asks the sink whether a message's
// destination is down too (see down), or nil when the sink cannot tell
// (it is no sinks.Prober). The question is bounded like a Send.
func (r *Relay) confirmer(hard context.Context) func(sinks.Message) error {
	p, ok := sinks.As[sinks.Prober](r.sink)
	if !ok {
		return nil
	}
	return func(m sinks.Message) error {
		ctx, cancel := context.WithTimeout(hard, r.cfg.PublishTimeout)
		defer cancel()
		return p.Probe(ctx, m)
	}
}

// waitRate waits until the rate limit lets n messages go, and records in
// the route's strain a wait that had to wait.
func (r *Relay) waitRate(ctx context.Context, n int) error {
	if r.limiter.Tokens() < float64(n) {
		r.strain.waitBegins(r.rateCause)
		defer r.strain.waitEnds()
	}
	return r.limiter.WaitN(ctx, n)
}

// send hands batch to the sink within PublishTimeout and records the
// answer in ev; pre, when not nil, holds the answer of the messages not
// to send (see sendReadable).
func (r *Relay) send(hard context.Context, batch []claim.Row, pre []error, ev *BatchEvent) {
	msgs := make([]sinks.Message, len(batch))
	for i := range batch {
		msgs[i] = batch[i].Msg
	}
	ev.Messages = msgs
	ev.SendStart = time.Now()
	sendCtx, cancel := context.WithTimeout(hard, r.cfg.PublishTimeout)
	ev.SendErr = r.sendReadable(sendCtx, batch, msgs, pre)
	cancel()
	ev.SendDuration = time.Since(ev.SendStart)
	// The claim ran at ClaimedAt (database clock), roughly when the claim
	// began.
	ev.AckedAt = batch[0].Msg.ClaimedAt.Add(ev.ClaimDuration + time.Since(ev.SendStart))
}

// sendReadable sends msgs to the sink, except those the claim did not
// read (over MaxMessageBytes), each of which fails permanently, so that
// it is dead-lettered, and those pre answers already (non-nil pre[i]: a
// destination that is down defers them). The later messages of their keys
// in the batch are not attempted (they come back in a later claim,
// behind the dead letter as the dead-letter policy says, or behind the
// deferred message). A batch without such a message goes to the sink as
// it is.
func (r *Relay) sendReadable(ctx context.Context, batch []claim.Row, msgs []sinks.Message, pre []error) error {
	n := 0
	for i := range batch {
		if batch[i].Oversize > 0 || pre != nil && pre[i] != nil {
			n++
		}
	}
	if n == 0 {
		return r.sink.Send(ctx, msgs)
	}
	be := sinks.NewBatchError(len(msgs))
	blocked := map[string]bool{}
	idx := make([]int, 0, len(msgs)-n)
	sub := make([]sinks.Message, 0, len(msgs)-n)
	for i, c := range batch {
		switch {
		case c.Oversize > 0:
			be.Errs[i] = sinks.Permanent(fmt.Errorf("%w: %d bytes, max-message-bytes %d; not read, not sent",
				errMessageTooLarge, c.Oversize, r.cfg.MaxMessageBytes))
		case c.Msg.Key != "" && blocked[c.Msg.Key]:
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		case pre != nil && pre[i] != nil:
			be.Errs[i] = pre[i]
		default:
			idx = append(idx, i)
			sub = append(sub, msgs[i])
			continue
		}
		if c.Msg.Key != "" {
			blocked[c.Msg.Key] = true
		}
	}
	if len(sub) > 0 {
		err := r.sink.Send(ctx, sub)
		for j, i := range idx {
			be.Errs[i] = sinks.Outcome(err, j, len(sub))
		}
	}
	return be
}

// errMessageTooLarge: a message is over Config.MaxMessageBytes. It is
// dead-lettered without being read.
var errMessageTooLarge = errors.New("outbox: message too large for the relay")

// decodeHeaders decodes a jsonb headers value; "{}" (the common case)
// costs nothing.
func decodeHeaders(raw []byte) (map[string]string, error) {
	if len(raw) <= 2 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	return h, nil
}

// Starvation: a worker that cannot get a connection cannot work its
// lanes, and while its relay keeps renewing them no other relay can
// either. The leaser hands the relay's lanes back when some worker has
// waited longer than LeaseTTL, as if the relay were dead, and takes a
// share again once every worker has a connection.

// starved reports whether some worker has been without a connection for
// longer than LeaseTTL, and for how long.
func (r *Relay) starved() (time.Duration, bool) {
	var longest time.Duration
	now := time.Now()
	for _, w := range r.workers {
		if since := w.connWait.Load(); since != 0 {
			longest = max(longest, now.Sub(time.Unix(0, since)))
		}
	}
	return longest, longest > r.cfg.LeaseTTL
}
