package relay

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// settlement is what a batch's settle decided: the delivered rows go
// (deleted, or archived), the retries wait in their rows, the dead letters
// move to the dead-letter table.
type settlement struct {
	delivered     []int64
	deliveredTIDs []pgtype.TID
	retries       store.Retries
	dead          store.DeadLetters
}

// Dead-letter reasons (the operator's selections accept these only).
const (
	ReasonPermanent   = store.ReasonPermanent
	ReasonMaxAttempts = store.ReasonMaxAttempts
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
			s.dead.IDs = append(s.dead.IDs, m.Seq)
			s.dead.Reasons = append(s.dead.Reasons, reason)
			s.dead.Errors = append(s.dead.Errors, errText(err))
			ev.DeadReasons = append(ev.DeadReasons, reason)
			if r.cfg.OnDeadLetter == OnDeadLetterHold && m.Key != "" {
				// The key waits for an operator: its dead letter stays
				// parked (store.Parked). A later message of it that the
				// sink delivered anyway breaks the order (logged above).
				held[m.Key] = true
				r.log.Warn("message dead-lettered; its key is held until the dead letter is replayed or purged",
					"message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "reason", reason, "error", err)
				continue
			}
			r.log.Warn("message dead-lettered", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "reason", reason, "error", err)
			// The key moves on: later messages of it may go in this same
			// batch, which the sink has already tried in order.
		default:
			delay := r.retryDelay(c.attempts + 1)
			if ra, ok := sinks.RetryAfter(err); ok && ra > delay {
				delay = min(ra, r.cfg.RetryMax)
			}
			s.retries.IDs = append(s.retries.IDs, m.Seq)
			s.retries.DelayMillis = append(s.retries.DelayMillis, delay.Milliseconds())
			s.retries.Errors = append(s.retries.Errors, errText(err))
			if m.Key != "" {
				held[m.Key] = true
			}
			r.log.Debug("delivery failed; retry scheduled", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "retry_in", delay, "error", err)
		}
	}
	ev.Delivered, ev.Retried, ev.DeadLettered = len(s.delivered), len(s.retries.IDs), len(s.dead.IDs)
	return s
}

// queue adds s's statements to b: delete (or archive) the delivered rows,
// schedule the retries, move the dead letters.
func (r *Relay) queue(b *pgx.Batch, src *source, s settlement) {
	if len(s.delivered) > 0 {
		if r.cfg.Archive {
			src.QueueArchive(b, s.delivered)
		} else {
			src.QueueDelete(b, s.deliveredTIDs)
		}
	}
	if len(s.retries.IDs) > 0 {
		src.QueueRetry(b, s.retries)
	}
	if len(s.dead.IDs) > 0 {
		src.QueueDeadLetter(b, s.dead)
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
