package relay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// fanOut is the router's settle: each claimed message is copied to its
// destination routes and leaves the outbox, in the claim's transaction
// (so a crash copies nothing, and a copy is never made twice). A message
// no destination takes (the routes changed under it) is dead-lettered.
func (r *Relay) fanOut(ctx context.Context, pc *pgx.Conn, src *source, batch []claimed) error {
	var copies store.CopyParams
	var dead store.DeadLetters
	for _, c := range batch {
		n := len(copies.IDs)
		for _, d := range r.cfg.FanOut {
			if d.matches(c.msg.Topic) {
				copies.IDs = append(copies.IDs, c.msg.Seq)
				copies.Routes = append(copies.Routes, d.Route)
			}
		}
		if len(copies.IDs) == n {
			dead.IDs = append(dead.IDs, c.msg.Seq)
			dead.Reasons = append(dead.Reasons, ReasonPermanent)
			dead.Errors = append(dead.Errors, fmt.Sprintf("no route matches topic %q", c.msg.Topic))
			continue
		}
		copies.CTIDs = append(copies.CTIDs, c.ctid)
	}
	b := &pgx.Batch{}
	if len(copies.IDs) > 0 {
		src.QueueCopy(b, copies)
		src.QueueDelete(b, copies.CTIDs)
	}
	if len(dead.IDs) > 0 {
		src.QueueDeadLetter(b, dead)
	}
	b.Queue("COMMIT")
	r.stats.Batches.Add(1)
	if err := pc.SendBatch(ctx, b).Close(); err != nil {
		r.stats.CommitFailures.Add(1)
		return fmt.Errorf("outbox: fan-out of %d messages: %w", len(batch), err)
	}
	r.stats.Delivered.Add(int64(len(copies.CTIDs)))
	r.stats.DeadLettered.Add(int64(len(dead.IDs)))
	return nil
}
