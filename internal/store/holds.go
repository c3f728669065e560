package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Held keys (the hold policy): a route that holds parks a dead-lettered
// message with a key in its table (states.go, Parked), which keeps the
// key's later messages pending until an operator replays or purges the
// dead letter. These statements find the parked rows through the partial
// indexes on available_at IS NOT NULL (a parked row's is 'infinity'), so
// they read nothing when nothing is held.

// HeldRoute is how many keys one route holds, how many messages wait
// behind them, and the age of its oldest hold.
type HeldRoute struct {
	Route     string
	Keys      int64
	OldestAge time.Duration
}

// parkedRows are the parked rows of the outbox and of the fan-out copies,
// as (route, id, key, lane, held_since, src): src 'm' for the outbox, 'c'
// for copies.
func (s Schema) parkedRows() string {
	return `SELECT coalesce(held_route, '') AS route, id, key, lane, held_since, 'm' AS src FROM ` + s.Table("messages") + `
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL
          UNION ALL SELECT route, id, key, lane, held_since, 'c' FROM ` + s.Table("deliveries") + `
          WHERE available_at IS NOT NULL AND held_since IS NOT NULL`
}

func (s Schema) heldRoutesSQL() string {
	return `
SELECT h.route, count(DISTINCT h.key), coalesce(extract(epoch FROM now() - min(` + boundedTime("h.held_since") + `)), 0)::float8
FROM (` + s.parkedRows() + `) h
GROUP BY h.route ORDER BY h.route`
}

// HeldRoutes returns, for every route holding keys, how many and since
// when. Cheap: it reads only the parked rows.
func (s Schema) HeldRoutes(ctx context.Context, q Querier) ([]HeldRoute, error) {
	return collect(ctx, q, s.heldRoutesSQL(), nil, func(r pgx.CollectableRow) (HeldRoute, error) {
		var h HeldRoute
		var age float64
		err := r.Scan(&h.Route, &h.Keys, &age)
		h.OldestAge = time.Duration(max(age, 0) * float64(time.Second))
		return h, err
	})
}

// Hold is one held key: the route, the dead letter that holds it (the
// key's first parked message), since when, and how many pending messages
// of the key wait behind it.
type Hold struct {
	Route  string
	Key    string
	ID     int64
	Since  time.Time
	Behind int64
}

func (s Schema) holdsSQL() string {
	return `
SELECT h.route, h.key, h.id, ` + boundedTime("h.held_since") + `,
       CASE WHEN h.src = 'm' THEN (SELECT count(*) FROM ` + s.Table("messages") + ` w
                WHERE w.lane = h.lane AND w.key = h.key AND w.id > h.id AND NOT ` + Parked("w") + `)
            ELSE (SELECT count(*) FROM ` + s.Table("deliveries") + ` w
                WHERE w.route = h.route AND w.lane = h.lane AND w.key = h.key AND w.id > h.id AND NOT ` + Parked("w") + `)
       END
FROM (
    SELECT DISTINCT ON (p.route, p.key) p.* FROM (` + s.parkedRows() + `) p
    ORDER BY p.route, p.key, p.id
) h
ORDER BY h.held_since, h.route, h.key
LIMIT @limit`
}

// Holds returns at most limit held keys, the oldest hold first.
func (s Schema) Holds(ctx context.Context, q Querier, limit int) ([]Hold, error) {
	return collect(ctx, q, s.holdsSQL(), pgx.NamedArgs{"limit": limit}, pgx.RowToStructByPos[Hold])
}
