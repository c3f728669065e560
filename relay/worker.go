package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// work is one worker's loop.
func (r *Relay) work(ctx, hard context.Context, worker int) {
	log := r.log.With("worker", worker)
	bo := newReconnectBackoff()
	rotation := worker
	for ctx.Err() == nil {
		r.lastLoop[worker].Store(time.Now().UnixNano())
		if r.schemaErr.Load() != nil {
			// Claim nothing on a schema this relay does not know.
			sleep(ctx, r.cfg.PollInterval)
			continue
		}
		n, more, err := r.cycle(ctx, hard, worker, rotation)
		rotation = (rotation + r.cfg.Workers) % numLanes
		if len(r.handoverLanes()) > 0 {
			// The batch that held a lane being handed over may have been
			// this one: the leaser can release it now.
			r.MembersChanged()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			if errors.Is(err, errNothingAttempted) {
				// The sink could not reach its backend (it wrote nothing):
				// the next cycle is the probe, and a backend that is back
				// should not wait the database's reconnect pace.
				d = min(d, time.Second)
			}
			log.Warn("batch failed; retrying", "error", err, "retry_in", d)
			if ch, ok := r.cfg.Hooks.(CycleErrorHooks); ok {
				ch.CycleError(err)
			}
			sleep(ctx, d)
			continue
		}
		bo.Reset()
		if n == 0 && r.leftover.Load() {
			// Nobody makes copies for this route any more: once none are
			// left, none will appear.
			if left, err := r.leftoverSrc.CopiesLeft(ctx, r.pool); err == nil && !left && r.leftover.CompareAndSwap(true, false) {
				log.Info("earlier fan-out copies all delivered; reading the outbox")
				r.wakeAll() // the other workers may be idle until their next poll
				continue
			}
		}
		if more {
			continue // the claim may have left some behind (see claim)
		}
		// The claim visited all of this worker's lanes: what was not there
		// then is newer, and the watcher wakes the worker for it, as for a
		// retry that comes due (a claim straight away would find nothing
		// at low rates: one empty transaction per message).
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-r.wake[worker]:
		case <-t.C:
		}
		t.Stop()
	}
}

// errNothingAttempted: the sink tried none of a batch's messages and
// reported no failure (its backend unreachable, or a broken sink).
var errNothingAttempted = errors.New("outbox: sink attempted nothing")

// cycle claims one batch, publishes it and settles the outcome, all in one
// transaction. It returns how many messages it claimed.
//
// more says whether the worker should claim again at once (see claim).
func (r *Relay) cycle(ctx, hard context.Context, worker, rotation int) (_ int, more bool, err error) {
	start := time.Now()
	r.waitingForConn(worker)
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		// Still without a connection (through the backoff too): see
		// starved.
		return 0, false, fmt.Errorf("outbox: acquire connection: %w", err)
	}
	r.gotConn(worker)
	if r.schemaErr.Load() != nil {
		// The schema outgrew this relay while the worker waited for the
		// connection: claim nothing.
		conn.Release()
		return 0, false, nil
	}
	defer func() {
		// A session that cannot write (it started on a read-only or
		// standby server) stays that way: close it so that the pool opens
		// a new one instead of handing it out again.
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "25006" {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}()
	// From here on the batch belongs to the hard context: a drain lets it
	// finish. BEGIN and the claim go out in one round trip, as do the
	// settle statements and COMMIT.
	pc := conn.Conn()
	committed := false
	defer func() {
		if !committed {
			rollback(hard, pc)
		}
	}()
	src := r.source()
	batch, more, err := r.claim(hard, pc, src, worker, rotation, r.handoverLanes())
	r.stats.Claims.Add(1)
	if err != nil {
		return 0, false, err
	}
	if len(batch) == 0 {
		if _, err := pc.Exec(hard, "COMMIT"); err != nil {
			return 0, false, fmt.Errorf("outbox: commit: %w", err)
		}
		committed = true
		return 0, false, nil
	}
	r.stats.Claimed.Add(int64(len(batch)))
	if src.router() {
		err = r.fanOut(hard, pc, src, batch)
	} else {
		err = r.publish(hard, pc, src, batch, BatchEvent{Worker: worker, Claimed: len(batch), ClaimDuration: time.Since(start)})
	}
	committed = err == nil
	return len(batch), more, err
}

// handoverLanes are the lanes the leaser is giving up: not to be claimed.
func (r *Relay) handoverLanes() []int16 {
	if h := r.handover.Load(); h != nil && *h != nil {
		return *h
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

// publish hands a claimed batch to the sink and settles the outcome in
// the claim's transaction, committing it; ev holds what the claim knows.
// A nil error means the transaction committed.
func (r *Relay) publish(hard context.Context, pc *pgx.Conn, src *source, batch []claimed, ev BatchEvent) error {
	r.inFlight.Add(int64(len(batch)))
	defer r.inFlight.Add(-int64(len(batch)))
	r.send(hard, batch, &ev)
	if hard.Err() != nil {
		// Drain deadline passed mid-publish: roll back so the messages come
		// back untouched (some may be delivered twice, never lost).
		return fmt.Errorf("outbox: drain timeout during publish: batch rolled back: %w", hard.Err())
	}
	s := r.settle(batch, ev.SendErr, &ev)
	if ev.Untouched == len(batch) {
		// The sink tried nothing and reported no failure (it broke off, or
		// breaks the contract): claiming the same batch again at once would
		// spin. Release it and let the worker back off.
		return fmt.Errorf("%w: none of %d messages: %w", errNothingAttempted, len(batch), ev.SendErr)
	}
	s, err := r.commit(hard, pc, src, s, &ev)
	r.stats.Batches.Add(1)
	if err != nil {
		r.stats.CommitFailures.Add(1)
		r.cfg.Hooks.Batch(ev)
		return fmt.Errorf("outbox: settle batch of %d (%d delivered messages will be delivered again): %w", len(batch), len(s.delivered), err)
	}
	if failed := len(s.retries.IDs) + len(s.dead.IDs); failed > 0 {
		r.warnFailing(failed, ev.SendErr)
	}
	r.stats.Delivered.Add(int64(len(s.delivered)))
	r.stats.Retried.Add(int64(len(s.retries.IDs)))
	r.stats.DeadLettered.Add(int64(len(s.dead.IDs)))
	r.cfg.Hooks.Batch(ev)
	return nil
}

// send hands batch to the sink within PublishTimeout and records the
// answer in ev.
func (r *Relay) send(hard context.Context, batch []claimed, ev *BatchEvent) {
	msgs := make([]sinks.Message, len(batch))
	for i := range batch {
		msgs[i] = batch[i].msg
	}
	ev.Messages = msgs
	ev.SendStart = time.Now()
	sendCtx, cancel := context.WithTimeout(hard, r.cfg.PublishTimeout)
	ev.SendErr = r.sink.Send(sendCtx, msgs)
	cancel()
	ev.SendDuration = time.Since(ev.SendStart)
	// The claim ran at ClaimedAt (database clock), roughly when the claim
	// began.
	ev.AckedAt = batch[0].msg.ClaimedAt.Add(ev.ClaimDuration + time.Since(ev.SendStart))
}

// commit queues s's statements and COMMIT in one round trip; when the
// database refuses them as a whole, the batch is settled row by row
// (settleApart). It returns what was settled, and records it in ev.
func (r *Relay) commit(hard context.Context, pc *pgx.Conn, src *source, s settlement, ev *BatchEvent) (settlement, error) {
	start := time.Now()
	b := &pgx.Batch{}
	r.queue(b, src, s)
	b.Queue("COMMIT")
	err := pc.SendBatch(hard, b).Close()
	if refusedRow(err) {
		r.log.Warn("the database refused to settle the batch; settling its messages one by one", "messages", len(ev.Messages), "error", err)
		s, err = r.settleApart(hard, pc, src, s)
		ev.Delivered, ev.Retried, ev.DeadLettered, ev.DeadReasons = len(s.delivered), len(s.retries.IDs), len(s.dead.IDs), s.dead.Reasons
	}
	ev.SettleDuration = time.Since(start)
	ev.Committed = err == nil
	return s, err
}

// warnFailing logs at most one warning per interval about failing
// deliveries, with the count since the previous one and a sample error.
func (r *Relay) warnFailing(n int, sample error) {
	const every = 30 * time.Second
	total := r.failures.Add(int64(n))
	now := time.Now().UnixNano()
	last := r.failWarned.Load()
	if now-last < int64(every) || !r.failWarned.CompareAndSwap(last, now) {
		return
	}
	r.failures.Add(-total)
	if last == 0 {
		r.log.Warn("deliveries failing", "failed", total, "error", sample)
		return
	}
	r.log.Warn("deliveries failing", "failed", total, "since", time.Duration(now-last).Round(time.Second).String(), "error", sample)
}

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

// errText bounds what is stored of an error.
func errText(err error) string {
	const max = 2000
	s := err.Error()
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
