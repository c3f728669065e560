// Package settle owns Settlement: what happens to a claimed batch once
// the sink has answered (or, for the fan-out router, once its
// destinations are known). It has two halves. The decision (Decide,
// Route) is pure: a batch and an answer in, a Settlement out. The
// Settler carries a Settlement out in the claim's transaction and ends
// it: one round trip of statements and COMMIT, row by row when the
// database refuses them as a whole (apart.go). Every batch, published or
// fanned out, goes through the same Settler; the relay reports what it
// settled (Result) to its totals and hooks.
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Settlement is what the decision made of a batch: the delivered rows go
// (deleted, or archived; the router copies them to their routes first),
// the retries wait in their rows, the dead letters move to the dead-letter
// table, and the untouched rows stay as they are.
type Settlement struct {
	delivered     []int64
	deliveredTIDs []pgtype.TID
	// copies: the fan-out router's copies of the delivered rows (Seqs and
	// Routes; CTIDs are deliveredTIDs).
	copies  store.CopyParams
	retries store.Retries
	// defers wait in their rows for their destination, counting no
	// attempt (see destinations).
	defers    store.Retries
	dead      store.DeadLetters
	untouched int
	// notes are the messages the log hears about: retried, dead-lettered
	// and delivered out of order, in batch order.
	notes []note
}

// note is one message of a batch that was not simply delivered.
type note struct {
	at     int // its index in the batch
	err    error
	wait   time.Duration // retried: until the next attempt
	reason string        // dead-lettered: store.ReasonPermanent or store.ReasonMaxAttempts
	// outOfOrder: the sink delivered it after an earlier message of its
	// key failed; holds: its dead letter holds its key (OnDeadLetterHold).
	outOfOrder, holds bool
}

// Retrier decides a failed message's next attempt (relay.RetryPolicy's
// method: every relay.RetryPolicy is one).
type Retrier interface {
	Retry(failures int, err error) (wait time.Duration, ok bool)
}

// Rules are what the decision depends on besides the batch and the
// answer.
type Rules struct {
	Retry Retrier
	// Hold: a dead letter holds the later messages of its key
	// (relay.OnDeadLetterHold).
	Hold bool
}

// Decide decides what happens to each message of a published batch given
// the sink's answer (sinks.Outcome of sendErr for each). Walking in batch
// order, the first failure of a key decides that key: its later messages
// stay untouched (no attempt counted), held back by the failed one. A
// permanent error dead-letters its message; any other error asks the
// retry policy, which schedules a retry or gives up (a dead letter for
// max attempts). A dead letter lets the key go on, unless the rules hold
// it. A later message of a held key that the sink delivered anyway (it
// broke the ordering contract) counts as delivered, never twice.
func Decide(batch []claim.Row, sendErr error, rl Rules) Settlement {
	var s Settlement
	var held map[string]bool
	hold := func(key string) {
		if key == "" {
			return
		}
		if held == nil {
			held = map[string]bool{}
		}
		held[key] = true
	}
	for i, c := range batch {
		m := &c.Msg
		err := sinks.Outcome(sendErr, i, len(batch))
		if m.Key != "" && held[m.Key] {
			if err == nil {
				s.deliver(c.Msg.Seq, c.CTID)
				s.notes = append(s.notes, note{at: i, outOfOrder: true})
			} else {
				s.untouched++
			}
			continue
		}
		switch {
		case err == nil:
			s.deliver(c.Msg.Seq, c.CTID)
		case claim.DeferredBy(err) != nil:
			// Its destination is down: it waits for it, and the later
			// messages of its key wait behind it.
			de := claim.DeferredBy(err)
			s.defers.Seqs = append(s.defers.Seqs, m.Seq)
			s.defers.DelayMillis = append(s.defers.DelayMillis, max(time.Until(de.Until), 0).Milliseconds())
			s.defers.Errors = append(s.defers.Errors, errText(err))
			hold(m.Key)
		case errors.Is(err, sinks.ErrNotAttempted):
			// Not tried (the sink stopped early): leave it, and the
			// later messages of its key with it.
			s.untouched++
			hold(m.Key)
		case sinks.IsPermanent(err):
			s.deadLetter(i, m.Seq, store.ReasonPermanent, err, rl.Hold && m.Key != "")
			if rl.Hold {
				hold(m.Key)
			}
		default:
			wait, ok := rl.Retry.Retry(c.Attempts+1, err)
			if !ok {
				s.deadLetter(i, m.Seq, store.ReasonMaxAttempts, err, rl.Hold && m.Key != "")
				if rl.Hold {
					hold(m.Key)
				}
				continue
			}
			s.retries.Seqs = append(s.retries.Seqs, m.Seq)
			s.retries.DelayMillis = append(s.retries.DelayMillis, wait.Milliseconds())
			s.retries.Errors = append(s.retries.Errors, errText(err))
			s.notes = append(s.notes, note{at: i, err: err, wait: wait})
			hold(m.Key)
		}
	}
	return s
}

// Route is the fan-out router's decision: each message is copied to
// every route that routes (given its topic) names, and leaves the outbox;
// a message no route takes (the routes changed under it) is
// dead-lettered.
func Route(batch []claim.Row, routes func(topic string) []string) Settlement {
	var s Settlement
	for i, c := range batch {
		n := len(s.copies.Seqs)
		for _, rt := range routes(c.Msg.Topic) {
			s.copies.Seqs = append(s.copies.Seqs, c.Msg.Seq)
			s.copies.Routes = append(s.copies.Routes, rt)
		}
		if len(s.copies.Seqs) == n {
			s.deadLetter(i, c.Msg.Seq, store.ReasonPermanent, fmt.Errorf("no route matches topic %q", c.Msg.Topic), false)
			continue
		}
		s.deliver(c.Msg.Seq, c.CTID)
	}
	return s
}

// deliver adds row id (at ctid) to the delivered rows.
func (s *Settlement) deliver(id int64, ctid pgtype.TID) {
	s.delivered = append(s.delivered, id)
	s.deliveredTIDs = append(s.deliveredTIDs, ctid)
}

func (s *Settlement) deadLetter(at int, id int64, reason string, err error, holds bool) {
	s.dead.Seqs = append(s.dead.Seqs, id)
	s.dead.Reasons = append(s.dead.Reasons, reason)
	s.dead.Errors = append(s.dead.Errors, errText(err))
	s.notes = append(s.notes, note{at: at, err: err, reason: reason, holds: holds})
}

// Counts are s's outcomes: delivered, retried, dead-lettered, and
// untouched (not attempted: held back, or waiting for their
// destination).
func (s *Settlement) Counts() (delivered, retried, dead, untouched int) {
	return len(s.delivered), len(s.retries.Seqs), len(s.dead.Seqs), s.untouched + len(s.defers.Seqs)
}

// DeadReasons has one entry per dead letter: store.ReasonPermanent or
// store.ReasonMaxAttempts.
func (s *Settlement) DeadReasons() []string { return s.dead.Reasons }

// DeliveredOf returns the messages of msgs (a published batch's, in batch
// order) that s delivered.
func (s *Settlement) DeliveredOf(msgs []sinks.Message) []sinks.Message {
	if len(s.delivered) == len(msgs) || len(s.delivered) == 0 {
		return msgs[:len(s.delivered)]
	}
	ids := make(map[int64]bool, len(s.delivered))
	for _, id := range s.delivered {
		ids[id] = true
	}
	out := make([]sinks.Message, 0, len(s.delivered))
	for _, m := range msgs {
		if ids[m.Seq] {
			out = append(out, m)
		}
	}
	return out
}

// Config is what a Settler works with.
type Config struct {
	Log *slog.Logger
	// Archive: delivered rows move to the archive table instead of only
	// being deleted.
	Archive bool
	// Park is how long a row whose dead letter the database refused waits
	// before its next attempt (see apart.park): the longest retry delay.
	Park time.Duration
}

// Settler carries settlements out and ends their transactions. It is
// shared by the workers of a relay.
type Settler struct {
	cfg     Config
	failing failingLog
}

// New returns the Settler of cfg.
func New(cfg Config) (*Settler, error) {
	if cfg.Log == nil {
		return nil, errors.New("outbox: settle: a logger is required")
	}
	if cfg.Park <= 0 {
		return nil, fmt.Errorf("outbox: settle: park must be positive, got %s", cfg.Park)
	}
	return &Settler{cfg: cfg}, nil
}

// Result is what a Settle carried out.
type Result struct {
	// Settled is the settlement as carried out: the one asked for, or
	// less when the database refused some rows (see apart).
	Settled Settlement
	// Duration is how long the settlement took, COMMIT included.
	Duration time.Duration
	// Apart: the database refused the settlement as a whole, and it was
	// carried out row by row in a transaction of its own (see apart):
	// what else the claim's transaction held was rolled back.
	Apart bool
}

// Foldable returns the rows whose deletion settles s when a claim can
// carry it (store.ClaimParams.Settle): every row of its batch delivered,
// read from the outbox or the fan-out copies, and deleted rather than
// archived. ok is false otherwise: s goes through Queue or Settle.
func (st *Settler) Foldable(src *store.Engine, s Settlement) (_ []pgtype.TID, ok bool) {
	if _, retried, dead, untouched := s.Counts(); st.cfg.Archive || src.Source() == store.Router || retried+dead+untouched > 0 {
		return nil, false
	}
	return s.deliveredTIDs, true
}

// Refused reports whether err is the database refusing a statement
// because of what a row holds (see refusedRow).
func Refused(err error) bool { return refusedRow(err) }

// Settle carries s out in the claim's transaction on pc (reading from
// src), commits it, and logs what the batch's messages need said
// (sendErr is the sink's answer, for the periodic "deliveries failing"
// warning). A nil error means the transaction committed.
func (st *Settler) Settle(ctx context.Context, pc *pgx.Conn, src *store.Engine, batch []claim.Row, s Settlement, sendErr error) (Result, error) {
	b := &pgx.Batch{}
	p := st.Queue(b, src, batch, s, sendErr)
	return p.Done(ctx, pc, pc.SendBatch(ctx, b).Close())
}

// Pending is a settlement queued on a batch of statements (Queue) that
// has not been read yet: the batch may go on past its COMMIT with the
// worker's next claim, so that a delivered batch costs no round trip of
// its own.
type Pending struct {
	st        *Settler
	src       *store.Engine
	batch     []claim.Row
	s         Settlement
	sendErr   error
	start     time.Time
	committed bool
}

// Queue queues s's statements and the COMMIT that ends the claim's
// transaction on b, as Settle would send them; the caller may queue more
// after them, sends b on the claim's session and hands its error to the
// Pending's Done.
func (st *Settler) Queue(b *pgx.Batch, src *store.Engine, batch []claim.Row, s Settlement, sendErr error) *Pending {
	st.logNotes(batch, s)
	p := &Pending{st: st, src: src, batch: batch, s: s, sendErr: sendErr, start: time.Now()}
	st.queue(b, src, s)
	b.Queue("COMMIT").Exec(func(pgconn.CommandTag) error {
		p.committed = true
		return nil
	})
	return p
}

// Committed reports whether the settlement's COMMIT went through (an
// error of its batch came from what was queued after it).
func (p *Pending) Committed() bool { return p.committed }

// Done ends the settlement after its batch was sent: err is the batch's
// error. When the database refused the settlement as a whole it is
// carried out row by row (apart) on pc. A nil error means the settlement
// committed, whatever became of the statements queued after it.
func (p *Pending) Done(ctx context.Context, pc *pgx.Conn, err error) (Result, error) {
	st, s := p.st, p.s
	apart := false
	if p.committed {
		err = nil
	} else if refusedRow(err) {
		st.cfg.Log.Warn("the database refused to settle the batch; settling its messages one by one", "messages", len(p.batch), "error", err)
		s, err = st.apart(ctx, pc, p.src, s)
		apart = true
	}
	res := Result{Settled: s, Duration: time.Since(p.start), Apart: apart}
	if err != nil {
		return res, fmt.Errorf("outbox: settle batch of %d (%d delivered messages will be delivered again): %w", len(p.batch), len(s.delivered), err)
	}
	if failed := s.Failed(); failed > 0 {
		st.failing.add(st.cfg.Log, len(s.retries.Seqs), len(s.dead.Seqs), s.untouched, p.sendErr)
	}
	return res, nil
}

// Failed counts the messages of s that failed and counted an attempt
// (retried or dead-lettered).
func (s *Settlement) Failed() int { return len(s.retries.Seqs) + len(s.dead.Seqs) }

// queue adds s's statements to b: copy (the router) and delete, or
// archive, the delivered rows, schedule the retries, move the dead
// letters.
func (st *Settler) queue(b *pgx.Batch, src *store.Engine, s Settlement) {
	if len(s.delivered) > 0 {
		switch {
		case src.Source() == store.Router:
			c := s.copies
			c.CTIDs = s.deliveredTIDs
			src.QueueCopy(b, c)
			src.QueueDelete(b, s.deliveredTIDs)
		case st.cfg.Archive:
			src.QueueArchive(b, s.deliveredTIDs)
		default:
			src.QueueDelete(b, s.deliveredTIDs)
		}
	}
	if len(s.retries.Seqs) > 0 {
		src.QueueRetry(b, s.retries)
	}
	if len(s.defers.Seqs) > 0 {
		src.QueueDefer(b, s.defers)
	}
	if len(s.dead.Seqs) > 0 {
		src.QueueDeadLetter(b, s.dead)
	}
}

// logNotes logs what s says about the messages of batch that were not
// simply delivered.
func (st *Settler) logNotes(batch []claim.Row, s Settlement) {
	for _, n := range s.notes {
		m := &batch[n.at].Msg
		switch {
		case n.outOfOrder:
			st.cfg.Log.Error("sink delivered a message after an earlier message of its key failed; per-key order broken",
				"message_id", m.ID, "topic", m.Topic)
		case n.reason != "" && n.holds:
			st.cfg.Log.Warn("message dead-lettered; its key is held until the dead letter is replayed or purged",
				"message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "reason", n.reason, "error", n.err)
		case n.reason != "":
			st.cfg.Log.Warn("message dead-lettered", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "reason", n.reason, "error", n.err)
		default:
			st.cfg.Log.Debug("delivery failed; retry scheduled", "message_id", m.ID, "topic", m.Topic, "attempt", m.Attempt, "retry_in", n.wait, "error", n.err)
		}
	}
}

// failingLog logs at most one warning per interval about failing
// deliveries, so that a sink outage shows in the logs at the default
// level without a line per message: how many messages failed since the
// previous one (retried and dead-lettered), how many were held back
// behind a failed message of their key without being tried, and one of
// the errors.
type failingLog struct {
	retried, dead, held atomic.Int64
	warned              atomic.Int64 // unix nanos
}

func (f *failingLog) add(log *slog.Logger, retried, dead, held int, sample error) {
	const every = 30 * time.Second
	nr, nd, nh := f.retried.Add(int64(retried)), f.dead.Add(int64(dead)), f.held.Add(int64(held))
	now := time.Now().UnixNano()
	last := f.warned.Load()
	if now-last < int64(every) || !f.warned.CompareAndSwap(last, now) {
		return
	}
	f.retried.Add(-nr)
	f.dead.Add(-nd)
	f.held.Add(-nh)
	args := []any{"failed", nr + nd, "retried", nr, "dead_lettered", nd, "held_back", nh, "error", FirstFailure(sample)}
	if last != 0 {
		args = append(args, "since", time.Duration(now-last).Round(time.Second).String())
	}
	log.Warn("deliveries failing", args...)
}

// FirstFailure is the error of the first message a sink tried and failed
// in a batch error (whose own text counts the held-back messages among
// the failed ones: "4 of 17 messages failed" for 1 failure and 3 held
// back), or err itself.
func FirstFailure(err error) error {
	var be *sinks.BatchError
	if !errors.As(err, &be) {
		return err
	}
	for _, e := range be.Errs {
		if e != nil && !errors.Is(e, sinks.ErrNotAttempted) {
			return e
		}
	}
	return err
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

// errText bounds what is stored of an error.
func errText(err error) string {
	const max = 2000
	s := err.Error()
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}
