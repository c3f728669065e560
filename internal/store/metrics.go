package store

import (
	"context"
	"time"
)

// The metrics' statements: cheap enough to run every few seconds. They
// count with the same state definitions as status (states.go), so that a
// gauge and `outbox-relay status` agree on the same table.

// Totals are the outbox's numbers as the metrics export them: pending
// messages (the outbox and the fan-out copies) by state, the age of the
// oldest, and the dead letters.
type Totals struct {
	Pending, Ready, Retrying, Delayed int64
	// OldestAge is the age of the outbox's first message by id or of the
	// oldest fan-out copy, whichever is older.
	OldestAge   time.Duration
	DeadLetters int64
}

func (s Schema) totalsSQL() string {
	msgs, copies := s.Table("messages"), s.Table("deliveries")
	// Retrying and delayed rows all have an available_at, so counting
	// them reads only the rows the partial indexes on available_at IS NOT
	// NULL hold (usually few), and ready is the rest: Queued, Failed and
	// Delayed partition the pending rows. The total is a plain count(*).
	// The oldest message of the outbox is its first by id (one row of an
	// index), not the least created_at of the table as in status, which
	// would read every row at every refresh. p is materialized: the
	// total is used twice and must be counted once.
	return `
WITH w AS (
    SELECT count(*) FILTER (WHERE ` + Failed("u") + `) retrying, count(*) FILTER (WHERE ` + Delayed("u") + `) delayed,
           count(*) FILTER (WHERE ` + Parked("u") + `) parked
    FROM (SELECT attempts, available_at, held_since FROM ` + msgs + ` WHERE available_at IS NOT NULL
          UNION ALL SELECT attempts, available_at, held_since FROM ` + copies + ` WHERE available_at IS NOT NULL) u
), p AS MATERIALIZED (
    SELECT (SELECT count(*) FROM ` + msgs + `) + (SELECT count(*) FROM ` + copies + `) - w.parked AS n FROM w
)
SELECT p.n, p.n - w.retrying - w.delayed, w.retrying, w.delayed,
       coalesce(extract(epoch FROM now() - least(
           (SELECT ` + boundedTime("m.created_at") + ` FROM ` + msgs + ` m WHERE m.held_since IS NULL ORDER BY m.id LIMIT 1),
           (SELECT min(` + boundedTime("c.created_at") + `) FROM ` + copies + ` c WHERE c.held_since IS NULL))), 0)::float8,
       (SELECT count(*) FROM ` + s.Table("dead_letters") + `)
FROM p, w`
}

// Totals counts the outbox for the metrics.
func (s Schema) Totals(ctx context.Context, q Querier) (Totals, error) {
	var t Totals
	var age float64
	err := q.QueryRow(ctx, s.totalsSQL()).Scan(&t.Pending, &t.Ready, &t.Retrying, &t.Delayed, &age, &t.DeadLetters)
	t.OldestAge = time.Duration(max(age, 0) * float64(time.Second))
	return t, err
}

func (s Schema) emptySQL() string {
	return `SELECT NOT EXISTS (SELECT 1 FROM ` + s.Table("messages") + ` WHERE held_since IS NULL)
   AND NOT EXISTS (SELECT 1 FROM ` + s.Table("deliveries") + ` WHERE held_since IS NULL)`
}

// Empty reports whether no message is pending: neither in the outbox nor
// as a fan-out copy (a parked dead letter is not pending; the messages
// its key holds back are). One statement, one snapshot: the fan-out router moves
// a message to its copies atomically, so it is always in one of the two.
func (s Schema) Empty(ctx context.Context, q Querier) (bool, error) {
	var empty bool
	err := q.QueryRow(ctx, s.emptySQL()).Scan(&empty)
	return empty, err
}
