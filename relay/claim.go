package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// claimed is one claimed row.
type claimed struct {
	msg      sinks.Message
	attempts int
	ctid     pgtype.TID
}

// source is where a worker's claims come from, and the statements that
// settle them: the outbox itself, the fan-out copies of this relay's
// route (the deliveries table), or, for the fan-out router, the outbox
// without payloads.
type source struct {
	q *queries
	// copies: the rows are fan-out copies (their statements also match
	// the route).
	copies bool
	// router: the rows are copied to their destination routes, not
	// published.
	router bool
	// topics and exclude are the route's patterns in LIKE form (nil: no
	// filter).
	topics, exclude []string
}

// source returns the source of the next claim.
func (r *Relay) source() source {
	if r.leftover.Load() {
		// Every copy made for this route is this route's, whatever its
		// patterns say now.
		return source{q: &r.copyQ, copies: true}
	}
	return source{q: &r.q, copies: r.cfg.Deliveries, router: len(r.cfg.FanOut) > 0, topics: r.topics, exclude: r.exclude}
}

// claim begins the batch's transaction on pc and claims up to BatchSize
// rows (and BatchBytes of payload) from src, in the lanes of worker
// (rotation chooses the first lane, handover are lanes no longer to be
// claimed). BEGIN, the priority probe and the claim go out in one round
// trip. The transaction stays open: the caller settles and commits it.
func (r *Relay) claim(hard context.Context, pc *pgx.Conn, src source, worker, rotation int, handover []int16) ([]claimed, error) {
	// The priority probe rides along with every claim; what it finds
	// chooses the claim of the worker's next cycle (the one with a
	// priority phase costs more, so it runs only while there are priority
	// messages).
	// The fan-out router copies in id order whatever the priority (the
	// destinations' claims honour it).
	q, copies, topics, exclude, router := src.q, src.copies, src.topics, src.exclude, src.router
	claim := q.claim
	switch {
	case router:
		claim = q.routerClaim
	case r.priority[worker]:
		claim = q.claimPriority
	}
	cb := &pgx.Batch{}
	cb.Queue("BEGIN")
	if !router {
		probe := []any{r.cfg.Workers, worker, topics, exclude}
		if copies {
			probe = append(probe, r.cfg.Route)
		}
		cb.Queue(q.hasPriority, probe...)
	}
	args := []any{r.cfg.ID, r.cfg.Workers, worker, rotation, r.cfg.BatchSize,
		r.cfg.Route, topics, exclude, handover}
	if !router {
		// The router reads no payloads: it has no byte limit.
		args = append(args, r.cfg.BatchBytes)
	}
	cb.Queue(claim, args...)
	br := pc.SendBatch(hard, cb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("outbox: begin: %w", err)
	}
	if !router {
		if err := br.QueryRow().Scan(&r.priority[worker]); err != nil {
			br.Close()
			return nil, fmt.Errorf("outbox: claim: priority probe: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	batch := make([]claimed, 0, r.cfg.BatchSize)
	var dbNow time.Time
	var headers []byte
	var createdAt pgtype.Timestamptz
	for rows.Next() {
		var c claimed
		m := &c.msg
		if err := rows.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &headers, &createdAt, &c.attempts, &dbNow, &c.ctid); err != nil {
			rows.Close()
			br.Close()
			return nil, fmt.Errorf("outbox: claim: scan: %w", err)
		}
		// A created_at of ±infinity (only ever written by hand) is
		// delivered as the claim's time.
		m.CreatedAt = finiteTime(createdAt, dbNow)
		if m.Headers, err = decodeHeaders(headers); err != nil {
			rows.Close()
			br.Close()
			return nil, fmt.Errorf("outbox: claim: headers of message %d: %w", m.Seq, err)
		}
		m.Attempt = c.attempts + 1
		m.ClaimedAt = dbNow
		batch = append(batch, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return batch, nil
}
