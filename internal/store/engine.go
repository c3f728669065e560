package store

import (
	"context"
	"crypto/md5" //nolint:gosec // the lane hash of migration 001, not a security measure

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// NumLanes is how many lanes every route has: fixed by migration 001 (the
// lanes table and the lane column).
const NumLanes = 256

// LaneOf is the lane of the row id with key (nil: no key), as the lane
// column computes it (migration 001): the first byte of the key's md5, or
// the id modulo NumLanes for a keyless row. The key is hashed as UTF-8,
// the server's bytes in a UTF-8 database. -1 for a negative id without
// a key (the column's value is then no lane).
func LaneOf(id int64, key *string) int {
	if key == nil {
		if id < 0 {
			return -1
		}
		return int(id % NumLanes)
	}
	sum := md5.Sum([]byte(*key)) //nolint:gosec // see above
	return int(sum[0])
}

// Source is where a relay's claims come from.
type Source int

const (
	// Outbox: the messages table itself.
	Outbox Source = iota
	// Copies: the fan-out copies of one route, in the deliveries table.
	// Every statement on them also matches the route.
	Copies
	// Router: the messages table, for the fan-out router, which copies
	// rows inside the database: its claim reads neither payloads nor
	// headers and has no byte limit.
	Router
)

func (s Source) String() string {
	switch s {
	case Copies:
		return "copies"
	case Router:
		return "router"
	}
	return "outbox"
}

// Engine holds the statements of one relay's claims and settlement,
// rendered once for a schema, a source and the relay's route. The route is
// bound here, not passed per call, because every statement that names one
// means the relay's own: the lanes it claims from, the copies it works on,
// the route its archive and dead-letter rows record.
type Engine struct {
	source Source
	route  string
	hold   bool

	claim, claimSettle, claimPriority, hasPriority stmt
	deleteDelivered, archiveDelivered              stmt
	scheduleRetry, deferRows, deadLetter, relock   stmt
	copyToRoutes, copiesLeft                       stmt
}

// NewEngine renders the statements of source for schema s and route.
// With hold (the route's on_dead_letter policy), a dead-lettered message
// with a key stays parked in its table and holds its key (states.go).
func NewEngine(s Schema, source Source, route string, hold bool) *Engine {
	// The router only copies: what it dead-letters never reached a
	// destination's order.
	e := &Engine{source: source, route: route, hold: hold && source != Router}
	e.renderClaim(s)
	e.renderSettle(s)
	e.renderFanOut(s)
	return e
}

// Source is the engine's source.
func (e *Engine) Source() Source { return e.source }

// args are st's arguments: a, and the engine's route (statements that do
// not mention @route ignore it).
func (e *Engine) args(st stmt, a pgx.NamedArgs) []any {
	a["route"] = e.route
	return st.args(a)
}

// table is the source's table: the outbox, or the fan-out copies.
func (e *Engine) table(s Schema) string {
	if e.source == Copies {
		return s.Table("deliveries")
	}
	return s.Table("messages")
}

// ofRoute restricts the row alias a of the source to this route's copies
// (nothing for the outbox, whose rows belong to no route yet).
func (e *Engine) ofRoute(a string) string {
	if e.source == Copies {
		return a + ".route = @route AND "
	}
	return ""
}

// ReadOnly reports whether the server cannot take the relay's writes: a
// standby, or a session whose transactions are read-only by default.
func ReadOnly(ctx context.Context, q Querier) (bool, error) {
	var ro bool
	err := q.QueryRow(ctx, `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool`).Scan(&ro)
	return ro, err
}

// Listen subscribes the session q to the notifications that writers (and
// the fan-out router) send about schema s's outbox.
func Listen(ctx context.Context, q Querier, s Schema) error {
	_, err := q.Exec(ctx, "LISTEN "+ident.Quote(ident.Channel(s.Name())))
	return err
}
