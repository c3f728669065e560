package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/sinks"
)

type settlement struct {
	delivered     []int64
	deliveredTIDs []pgtype.TID
	retryIDs      []int64
	retryDelays   []int64
	retryErrs     []string
	deadIDs       []int64
	deadReasons   []string
	deadErrs      []string
}

// Dead-letter reasons.
const (
	ReasonPermanent   = "permanent"
	ReasonMaxAttempts = "max_attempts"
)

// settle decides what happens to each message of a batch given the sink's
// answer. Walking in batch order, the first failure of a key decides that
// key: later messages of the key stay untouched (no attempt counted), held
// back by the failed one.
func (r *Relay) settle(batch []claimed, sendErr error, ev *BatchEvent) settlement {
	var s settlement
	held := map[string]bool{}
	for i, c := range batch {
		m := c.msg
		err := sinks.Outcome(sendErr, i, len(batch))
		if m.Key != "" && held[m.Key] {
			if err == nil {
				// The sink broke the ordering contract and delivered a later
				// message of a failed key. It was delivered: do not deliver
				// it twice, but say so loudly.
				r.log.Error("sink delivered a message after an earlier message of its key failed; per-key order broken",
					"message_id", m.ID, "topic", m.Topic)
				s.delivered = append(s.delivered, m.Seq)
				s.deliveredTIDs = append(s.deliveredTIDs, c.ctid)
				ev.DeliveredMessages = append(ev.DeliveredMessages, m)
			} else {
				ev.Untouched++
			}
			continue
		}
		switch {
		case err == nil:
			s.delivered = append(s.delivered, m.Seq)
			s.deliveredTIDs = append(s.deliveredTIDs, c.ctid)
			ev.DeliveredMessages = append(ev.DeliveredMessages, m)
		case errors.Is(err, sinks.ErrNotAttempted):
			// Not tried (an earlier failure of the same key, which we
			// have handled above, or a sink that stopped early): leave it.
			ev.Untouched++
			if m.Key != "" {
				held[m.Key] = true
			}
		case sinks.IsPermanent(err) || c.attempts+1 >= r.cfg.MaxAttempts:
			reason := ReasonMaxAttempts
			if sinks.IsPermanent(err) {
				reason = ReasonPermanent
			}
			s.deadIDs = append(s.deadIDs, m.Seq)
			s.deadReasons = append(s.deadReasons, reason)
			s.deadErrs = append(s.deadErrs, errText(err))
			ev.DeadReasons = append(ev.DeadReasons, reason)
			r.log.Warn("message dead-lettered", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "reason", reason, "error", err)
			// The key moves on: later messages of it may go in this same
			// batch, which the sink has already tried in order.
		default:
			delay := r.retryDelay(c.attempts + 1)
			if ra, ok := sinks.RetryAfter(err); ok && ra > delay {
				delay = min(ra, r.cfg.RetryMax)
			}
			s.retryIDs = append(s.retryIDs, m.Seq)
			s.retryDelays = append(s.retryDelays, delay.Milliseconds())
			s.retryErrs = append(s.retryErrs, errText(err))
			if m.Key != "" {
				held[m.Key] = true
			}
			r.log.Debug("delivery failed; retry scheduled", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "retry_in", delay, "error", err)
		}
	}
	ev.Delivered, ev.Retried, ev.DeadLettered = len(s.delivered), len(s.retryIDs), len(s.deadIDs)
	return s
}

// queue adds s's statements to b: delete (or archive) the delivered rows,
// schedule the retries, move the dead letters.
func (r *Relay) queue(b *pgx.Batch, q *queries, copies bool, s settlement) {
	if len(s.delivered) > 0 {
		if r.cfg.Archive {
			b.Queue(q.archiveDelivered, s.delivered, r.cfg.Route)
		} else {
			b.Queue(q.deleteDelivered, s.deliveredTIDs)
		}
	}
	if len(s.retryIDs) > 0 {
		b.Queue(q.scheduleRetry, r.withRoute(copies, s.retryIDs, s.retryDelays, s.retryErrs)...)
	}
	if len(s.deadIDs) > 0 {
		b.Queue(q.deadLetter, r.withRoute(copies, s.deadIDs, s.deadReasons, s.deadErrs)...)
	}
}

// refusedRow reports whether err is the database refusing a statement
// because of what some row holds (an index entry over the size limit, a
// constraint, a statement that a newer schema no longer accepts), as
// opposed to a connection, a server or a transaction that failed: only
// the former is worth settling row by row.
func refusedRow(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	switch pe.Code[:2] {
	case "22", // data exception
		"23", // integrity constraint violation
		"42", // syntax error or access rule violation (a schema this relay does not know)
		"54", // program limit exceeded: "index row size … exceeds … maximum"
		"P0": // raised by a function or trigger
		return true
	}
	return false
}

// settleApart settles a batch whose settle statements the database refused
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
func (r *Relay) settleApart(ctx context.Context, pc *pgx.Conn, q *queries, copies bool, s settlement) (settlement, error) {
	if _, err := pc.Exec(ctx, "ROLLBACK"); err != nil {
		return settlement{}, err
	}
	ids := make([]int64, 0, len(s.delivered)+len(s.retryIDs)+len(s.deadIDs))
	ids = append(append(append(ids, s.delivered...), s.retryIDs...), s.deadIDs...)
	if _, err := pc.Exec(ctx, "BEGIN"); err != nil {
		return settlement{}, err
	}
	rows, err := pc.Query(ctx, q.relock, r.withRoute(copies, ids)...)
	if err != nil {
		return settlement{}, err
	}
	tids := map[int64]pgtype.TID{}
	var id int64
	var tid pgtype.TID
	if _, err := pgx.ForEachRow(rows, []any{&id, &tid}, func() error { tids[id] = tid; return nil }); err != nil {
		return settlement{}, err
	}

	// try runs one statement in a savepoint. A refusal is rolled back to
	// the savepoint and returned as refused; anything else is fatal.
	try := func(sql string, args ...any) (refused, fatal error) {
		b := &pgx.Batch{}
		b.Queue("SAVEPOINT settle_row")
		b.Queue(sql, args...)
		b.Queue("RELEASE SAVEPOINT settle_row")
		err := pc.SendBatch(ctx, b).Close()
		if err == nil || !refusedRow(err) {
			return nil, err
		}
		if _, rerr := pc.Exec(ctx, "ROLLBACK TO SAVEPOINT settle_row"); rerr != nil {
			return nil, rerr
		}
		return err, nil
	}
	// each tries the statements of the whole group, then of each row alone
	// when the group is refused, calling done for every row settled and
	// fallback (which may be nil) for every row refused.
	each := func(n int, stmt func(i ...int) (string, []any), done func(i int), fallback func(i int, refused error) error) error {
		if n == 0 {
			return nil
		}
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		sql, args := stmt(all...)
		refused, err := try(sql, args...)
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
			sql, args := stmt(i)
			refused, err := try(sql, args...)
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
	present := func(ids []int64) []int {
		var out []int
		for i, id := range ids {
			if _, ok := tids[id]; ok {
				out = append(out, i)
			}
		}
		return out
	}
	var out settlement
	// park keeps row id, whose dead letter the database refused, in the
	// outbox: its next attempt waits RetryMax, so it is neither lost nor
	// sent again at every cycle.
	park := func(id int64, text string, refused error) error {
		r.log.Error("message cannot be dead-lettered; it stays in the outbox and is tried again after the longest retry delay",
			"id", id, "retry_in", r.cfg.RetryMax, "error", refused)
		text = errText(fmt.Errorf("cannot be dead-lettered (%v) after: %s", refused, text))
		refused, err := try(q.scheduleRetry, r.withRoute(copies, []int64{id}, []int64{r.cfg.RetryMax.Milliseconds()}, []string{text})...)
		if err == nil && refused == nil {
			out.retryIDs = append(out.retryIDs, id)
			out.retryDelays = append(out.retryDelays, r.cfg.RetryMax.Milliseconds())
			out.retryErrs = append(out.retryErrs, text)
		}
		return err
	}
	// deadLetter moves row id to the dead letters, or parks it.
	deadLetter := func(id int64, reason, text string) error {
		refused, err := try(q.deadLetter, r.withRoute(copies, []int64{id}, []string{reason}, []string{text})...)
		if err != nil || refused != nil {
			if refused != nil {
				return park(id, text, refused)
			}
			return err
		}
		out.deadIDs = append(out.deadIDs, id)
		out.deadReasons = append(out.deadReasons, reason)
		out.deadErrs = append(out.deadErrs, text)
		return nil
	}

	dl := present(s.delivered)
	err = each(len(dl), func(is ...int) (string, []any) {
		ids, ts := make([]int64, len(is)), make([]pgtype.TID, len(is))
		for j, i := range is {
			ids[j], ts[j] = s.delivered[dl[i]], tids[s.delivered[dl[i]]]
		}
		if r.cfg.Archive {
			return q.archiveDelivered, []any{ids, r.cfg.Route}
		}
		return q.deleteDelivered, []any{ts}
	}, func(i int) {
		out.delivered = append(out.delivered, s.delivered[dl[i]])
	}, func(i int, refused error) error {
		id := s.delivered[dl[i]]
		if !r.cfg.Archive {
			r.log.Error("delivered message cannot be removed from the outbox; it will be delivered again", "id", id, "error", refused)
			return nil
		}
		r.log.Error("delivered message cannot be archived; removing it from the outbox without its archive copy", "id", id, "error", refused)
		refused, err := try(q.deleteDelivered, []pgtype.TID{tids[id]})
		if err == nil && refused == nil {
			out.delivered = append(out.delivered, id)
		}
		return err
	})
	if err != nil {
		return settlement{}, err
	}

	rt := present(s.retryIDs)
	err = each(len(rt), func(is ...int) (string, []any) {
		ids, delays, errs := make([]int64, len(is)), make([]int64, len(is)), make([]string, len(is))
		for j, i := range is {
			k := rt[i]
			ids[j], delays[j], errs[j] = s.retryIDs[k], s.retryDelays[k], s.retryErrs[k]
		}
		return q.scheduleRetry, r.withRoute(copies, ids, delays, errs)
	}, func(i int) {
		k := rt[i]
		out.retryIDs = append(out.retryIDs, s.retryIDs[k])
		out.retryDelays = append(out.retryDelays, s.retryDelays[k])
		out.retryErrs = append(out.retryErrs, s.retryErrs[k])
	}, func(i int, refused error) error {
		k := rt[i]
		text := errText(fmt.Errorf("cannot schedule a retry (%v) after: %s", refused, s.retryErrs[k]))
		r.log.Warn("message dead-lettered: the database refused its retry", "id", s.retryIDs[k], "error", refused)
		return deadLetter(s.retryIDs[k], ReasonPermanent, text)
	})
	if err != nil {
		return settlement{}, err
	}

	dd := present(s.deadIDs)
	err = each(len(dd), func(is ...int) (string, []any) {
		ids, reasons, errs := make([]int64, len(is)), make([]string, len(is)), make([]string, len(is))
		for j, i := range is {
			k := dd[i]
			ids[j], reasons[j], errs[j] = s.deadIDs[k], s.deadReasons[k], s.deadErrs[k]
		}
		return q.deadLetter, r.withRoute(copies, ids, reasons, errs)
	}, func(i int) {
		k := dd[i]
		out.deadIDs = append(out.deadIDs, s.deadIDs[k])
		out.deadReasons = append(out.deadReasons, s.deadReasons[k])
		out.deadErrs = append(out.deadErrs, s.deadErrs[k])
	}, func(i int, refused error) error {
		k := dd[i]
		return park(s.deadIDs[k], s.deadErrs[k], refused)
	})
	if err != nil {
		return settlement{}, err
	}
	if _, err := pc.Exec(ctx, "COMMIT"); err != nil {
		return settlement{}, err
	}
	return out, nil
}
