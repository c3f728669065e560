package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Fan-out: the router copies each claimed message of the outbox to its
// destination routes (the deliveries table), where those routes' relays
// claim them as their source Copies.

// CopyParams are the copies the router makes, as parallel slices: message
// Seqs[i] goes to route Routes[i] (a message appears once per
// destination). CTIDs are the claimed messages' ctids, each once.
type CopyParams struct {
	Seqs   []int64
	Routes []string
	CTIDs  []pgtype.TID
}

// QueueCopy queues the copies c. The messages are read by ctid (they are
// locked by the claim, so it is stable). No ON CONFLICT: a message is
// copied in the transaction that removes it from the outbox, so a copy can
// only exist already if ids were reused by hand, and then failing loudly
// beats dropping a copy (the statement is also a third cheaper).
func (e *Engine) QueueCopy(b *pgx.Batch, c CopyParams) {
	b.Queue(e.copyToRoutes.sql, e.args(e.copyToRoutes, pgx.NamedArgs{"ids": c.Seqs, "routes": c.Routes, "ctids": c.CTIDs})...)
}

// CopiesLeft reports whether fan-out copies made for the relay's route are
// waiting in the deliveries table.
func (e *Engine) CopiesLeft(ctx context.Context, q Querier) (bool, error) {
	var left bool
	err := q.QueryRow(ctx, e.copiesLeft.sql, e.args(e.copiesLeft, pgx.NamedArgs{})...).Scan(&left)
	return left, err
}

func (e *Engine) renderFanOut(s Schema) {
	e.copyToRoutes = newStmt(`
INSERT INTO ` + s.Table("deliveries") + `
    (route, id, message_id, topic, key, payload, headers, lane, created_at, dedup_key, priority)
SELECT d.route, m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at, m.dedup_key, m.priority
FROM (SELECT * FROM ` + s.Table("messages") + ` WHERE ctid = ANY(@ctids::tid[])) m
JOIN unnest(@ids::bigint[], @routes::text[]) AS d(id, route) ON d.id = m.id`)

	// A parked copy, and the copies its hold keeps back, are not left for
	// the route to work through: they wait for an operator.
	e.copiesLeft = newStmt(`SELECT EXISTS (SELECT 1 FROM ` + s.Table("deliveries") + ` c WHERE c.route = @route AND c.held_since IS NULL
    AND NOT EXISTS (SELECT 1 FROM ` + s.Table("deliveries") + ` h
                    WHERE h.route = c.route AND h.key = c.key AND h.id < c.id AND ` + Parked("h") + `))`)
}
