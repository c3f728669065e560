package settle

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// apart settles a batch whose settle statements the database refused
// as a whole (refusedRow). Without it, one row the database cannot store
// failed the settle of every batch it was in: the batch's delivered
// messages were published again each cycle and nothing left the outbox.
//
// The refused transaction is rolled back; a new one locks the batch's rows
// again (skipping any that another relay took meanwhile) and settles each
// group of rows in a savepoint, and row by row when the group is refused.
// A row whose own statement is refused gets its fallback: a retry that
// cannot be scheduled becomes a dead letter saying why; a delivered message
// that cannot be archived is removed without its archive copy. A row that
// cannot even be dead-lettered stays in the outbox, is logged, and comes
// back (alone) in a later batch. It returns what was settled.
func (st *Settler) apart(ctx context.Context, pc *pgx.Conn, src *store.Engine, s Settlement) (Settlement, error) {
	if _, err := pc.Exec(ctx, "ROLLBACK"); err != nil {
		return Settlement{}, err
	}
	ids := make([]int64, 0, len(s.delivered)+len(s.retries.Seqs)+len(s.defers.Seqs)+len(s.dead.Seqs))
	ids = append(append(append(append(ids, s.delivered...), s.retries.Seqs...), s.defers.Seqs...), s.dead.Seqs...)
	if _, err := pc.Exec(ctx, store.Begin); err != nil {
		return Settlement{}, err
	}
	tids, err := src.Relock(ctx, pc, ids)
	if err != nil {
		return Settlement{}, err
	}
	a := &apart{st: st, ctx: ctx, pc: pc, src: src, tids: tids}
	a.out.untouched = s.untouched
	for _, phase := range []func(Settlement) error{a.delivered, a.retries, a.defers, a.deadLetters} {
		if err := phase(s); err != nil {
			return Settlement{}, err
		}
	}
	if _, err := pc.Exec(ctx, "COMMIT"); err != nil {
		return Settlement{}, err
	}
	return a.out, nil
}

// apart is one settler.apart: the rows still this worker's (tids, by id)
// and what has been settled of them (out).
type apart struct {
	st   *Settler
	ctx  context.Context
	pc   *pgx.Conn
	src  *store.Engine
	tids map[int64]pgtype.TID
	out  Settlement
}

// try runs the statement that queue queues in a savepoint. A refusal is
// rolled back to the savepoint and returned as refused; anything else is
// fatal.
func (a *apart) try(queue func(b *pgx.Batch)) (refused, fatal error) {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT settle_row")
	queue(b)
	b.Queue("RELEASE SAVEPOINT settle_row")
	err := a.pc.SendBatch(a.ctx, b).Close()
	if err == nil || !refusedRow(err) {
		return nil, err
	}
	if _, rerr := a.pc.Exec(a.ctx, "ROLLBACK TO SAVEPOINT settle_row"); rerr != nil {
		return nil, rerr
	}
	return err, nil
}

// each tries the statement of the whole group of n rows (queue queues it
// for the rows is), then of each row alone when the group is refused,
// calling done for every row settled and fallback (which may be nil) for
// every row refused.
func (a *apart) each(n int, queue func(b *pgx.Batch, is ...int), done func(i int), fallback func(i int, refused error) error) error {
	if n == 0 {
		return nil
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	refused, err := a.try(func(b *pgx.Batch) { queue(b, all...) })
	if err != nil {
		return err
	}
	if refused == nil {
		for _, i := range all {
			done(i)
		}
		return nil
	}
	for i := range n {
		refused, err := a.try(func(b *pgx.Batch) { queue(b, i) })
		switch {
		case err != nil:
			return err
		case refused == nil:
			done(i)
		case fallback != nil:
			if err := fallback(i, refused); err != nil {
				return err
			}
		}
	}
	return nil
}

// present keeps the indexes of rows that are still this worker's.
func (a *apart) present(ids []int64) []int {
	var out []int
	for i, id := range ids {
		if _, ok := a.tids[id]; ok {
			out = append(out, i)
		}
	}
	return out
}

// delivered removes (or archives, or for the router copies to their
// routes and removes) s's delivered rows. One that cannot be archived is
// removed without its archive copy; one the router cannot copy is
// dead-lettered saying why; one that cannot even be removed stays, and
// will be delivered again.
func (a *apart) delivered(s Settlement) error {
	dl := a.present(s.delivered)
	router := a.src.Source() == store.Router
	var routes map[int64][]string
	if router {
		routes = make(map[int64][]string, len(dl))
		for k, id := range s.copies.Seqs {
			routes[id] = append(routes[id], s.copies.Routes[k])
		}
	}
	return a.each(len(dl), func(b *pgx.Batch, is ...int) {
		ids, ts := make([]int64, len(is)), make([]pgtype.TID, len(is))
		var c store.CopyParams
		for j, i := range is {
			id := s.delivered[dl[i]]
			ids[j], ts[j] = id, a.tids[id]
			for _, rt := range routes[id] {
				c.Seqs, c.Routes = append(c.Seqs, id), append(c.Routes, rt)
			}
		}
		switch {
		case router:
			c.CTIDs = ts
			a.src.QueueCopy(b, c)
			a.src.QueueDelete(b, ts)
		case a.st.cfg.Archive:
			a.src.QueueArchive(b, ts)
		default:
			a.src.QueueDelete(b, ts)
		}
	}, func(i int) {
		id := s.delivered[dl[i]]
		a.out.deliver(id, a.tids[id])
		if router {
			for _, rt := range routes[id] {
				a.out.copies.Seqs, a.out.copies.Routes = append(a.out.copies.Seqs, id), append(a.out.copies.Routes, rt)
			}
		}
	}, func(i int, refused error) error {
		id := s.delivered[dl[i]]
		switch {
		case router:
			a.st.cfg.Log.Error("message cannot be copied to its routes; dead-lettering it", "id", id, "error", refused)
			return a.deadLetter(id, store.ReasonPermanent, errText(fmt.Errorf("cannot be copied to its routes: %v", refused)))
		case !a.st.cfg.Archive:
			a.st.cfg.Log.Error("delivered message cannot be removed from the outbox; it will be delivered again", "id", id, "error", refused)
			return nil
		}
		a.st.cfg.Log.Error("delivered message cannot be archived; removing it from the outbox without its archive copy", "id", id, "error", refused)
		refused, err := a.try(func(b *pgx.Batch) { a.src.QueueDelete(b, []pgtype.TID{a.tids[id]}) })
		if err == nil && refused == nil {
			a.out.deliver(id, a.tids[id])
		}
		return err
	})
}

// retries schedules s's retries. A retry that cannot be scheduled becomes
// a dead letter saying why.
func (a *apart) retries(s Settlement) error {
	rt := s.retries
	return settleRows(a, rt.Seqs, rt, addRetry, a.src.QueueRetry, &a.out.retries, func(k int, refused error) error {
		text := errText(fmt.Errorf("cannot schedule a retry (%v) after: %s", refused, rt.Errors[k]))
		a.st.cfg.Log.Warn("message dead-lettered: the database refused its retry", "id", rt.Seqs[k], "error", refused)
		return a.deadLetter(rt.Seqs[k], store.ReasonPermanent, text)
	})
}

// defers defers s's deferred rows. One that cannot be deferred stays as
// it is: it was not sent, and comes back in a later claim.
func (a *apart) defers(s Settlement) error {
	d := s.defers
	return settleRows(a, d.Seqs, d, addRetry, a.src.QueueDefer, &a.out.defers, func(int, error) error {
		a.out.untouched++
		return nil
	})
}

// deadLetters moves s's dead letters. One that cannot be dead-lettered is
// parked.
func (a *apart) deadLetters(s Settlement) error {
	dd := s.dead
	return settleRows(a, dd.Seqs, dd, addDead, a.src.QueueDeadLetter, &a.out.dead, func(k int, refused error) error {
		return a.park(dd.Seqs[k], dd.Errors[k], refused)
	})
}

// settleRows settles rows (whose k-th row is ids[k]) as a whole, or row by
// row (see apart.each), with the statement queue queues, adding each row
// settled to out and calling fallback for each row refused.
func settleRows[P any](a *apart, ids []int64, rows P, add func(to *P, from P, k int), queue func(*pgx.Batch, P), out *P, fallback func(k int, refused error) error) error {
	idx := a.present(ids)
	return a.each(len(idx), func(b *pgx.Batch, is ...int) {
		var p P
		for _, i := range is {
			add(&p, rows, idx[i])
		}
		queue(b, p)
	}, func(i int) {
		add(out, rows, idx[i])
	}, func(i int, refused error) error {
		return fallback(idx[i], refused)
	})
}

// deadLetter moves row id to the dead letters, or parks it.
func (a *apart) deadLetter(id int64, reason, text string) error {
	d := store.DeadLetters{Seqs: []int64{id}, Reasons: []string{reason}, Errors: []string{text}}
	refused, err := a.try(func(b *pgx.Batch) { a.src.QueueDeadLetter(b, d) })
	if err != nil || refused != nil {
		if refused != nil {
			return a.park(id, text, refused)
		}
		return err
	}
	addDead(&a.out.dead, d, 0)
	return nil
}

// park keeps row id, whose dead letter the database refused, in the
// outbox: its next attempt waits RetryMax, so it is neither lost nor sent
// again at every cycle.
func (a *apart) park(id int64, text string, refused error) error {
	wait := a.st.cfg.Park
	a.st.cfg.Log.Error("message cannot be dead-lettered; it stays in the outbox and is tried again after the longest retry delay",
		"id", id, "retry_in", wait, "error", refused)
	text = errText(fmt.Errorf("cannot be dead-lettered (%v) after: %s", refused, text))
	p := store.Retries{Seqs: []int64{id}, DelayMillis: []int64{wait.Milliseconds()}, Errors: []string{text}}
	refused, err := a.try(func(b *pgx.Batch) { a.src.QueueRetry(b, p) })
	if err == nil && refused == nil {
		addRetry(&a.out.retries, p, 0)
	}
	return err
}

// addRetry appends from's k-th retry to to.
func addRetry(to *store.Retries, from store.Retries, k int) {
	to.Seqs = append(to.Seqs, from.Seqs[k])
	to.DelayMillis = append(to.DelayMillis, from.DelayMillis[k])
	to.Errors = append(to.Errors, from.Errors[k])
}

// addDead appends from's k-th dead letter to to.
func addDead(to *store.DeadLetters, from store.DeadLetters, k int) {
	to.Seqs = append(to.Seqs, from.Seqs[k])
	to.Reasons = append(to.Reasons, from.Reasons[k])
	to.Errors = append(to.Errors, from.Errors[k])
}
