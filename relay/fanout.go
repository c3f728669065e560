package relay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// copiesLeft reports whether fan-out copies for this relay's route exist.
func (r *Relay) copiesLeft(ctx context.Context) (bool, error) {
	var left bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+migrations.Ident(r.cfg.Schema)+`.deliveries WHERE route = $1)`,
		r.cfg.Route).Scan(&left)
	return left, err
}

// fanOut is the router's settle: each claimed message is copied to its
// destination routes and leaves the outbox, in the claim's transaction
// (so a crash copies nothing, and a copy is never made twice). A message
// no destination takes (the routes changed under it) is dead-lettered.
func (r *Relay) fanOut(ctx context.Context, pc *pgx.Conn, batch []claimed) error {
	var ids []int64
	var routes []string
	var tids []pgtype.TID
	var deadIDs []int64
	var deadReasons, deadErrs []string
	for _, c := range batch {
		n := len(ids)
		for _, d := range r.cfg.FanOut {
			if d.matches(c.msg.Topic) {
				ids = append(ids, c.msg.Seq)
				routes = append(routes, d.Route)
			}
		}
		if len(ids) == n {
			deadIDs = append(deadIDs, c.msg.Seq)
			deadReasons = append(deadReasons, ReasonPermanent)
			deadErrs = append(deadErrs, fmt.Sprintf("no route matches topic %q", c.msg.Topic))
			continue
		}
		tids = append(tids, c.ctid)
	}
	b := &pgx.Batch{}
	if len(ids) > 0 {
		b.Queue(r.q.copyToRoutes, ids, routes, tids)
		b.Queue(r.q.deleteDelivered, tids)
	}
	if len(deadIDs) > 0 {
		b.Queue(r.q.deadLetter, deadIDs, deadReasons, deadErrs)
	}
	b.Queue("COMMIT")
	r.stats.Batches.Add(1)
	if err := pc.SendBatch(ctx, b).Close(); err != nil {
		r.stats.CommitFailures.Add(1)
		return fmt.Errorf("outbox: fan-out of %d messages: %w", len(batch), err)
	}
	r.stats.Delivered.Add(int64(len(tids)))
	r.stats.DeadLettered.Add(int64(len(deadIDs)))
	return nil
}
