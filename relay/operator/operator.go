// Package operator holds the actions an operator takes on a running
// outbox: the status snapshot (backlog by topic and fan-out route, dead
// letters, relays and their lanes), the dead letters (list, show, replay,
// purge) and the replay of the archive.
//
// It is the library behind the `outbox-relay status`, `dlq` and `replay`
// commands, and is shaped to be served over HTTP as it is: every method
// takes a context first, every result is plain data with JSON tags, long
// lists are paged, and errors are prefixed "outbox:" and say what failed
// (sentinels such as ErrEmptySelection and ErrNotFound are found with
// errors.Is).
//
// It runs no relay and imports none of package relay; the SQL it runs is
// in internal/store, with the definitions of the message states (ready,
// retrying, delayed) that the Prometheus metrics share.
package operator

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// Admin runs the operator actions on one schema. It is safe for
// concurrent use.
type Admin struct {
	pool   *pgxpool.Pool
	schema store.Schema
}

// New returns an Admin for schema (empty: the default schema, "outbox").
func New(pool *pgxpool.Pool, schema string) (*Admin, error) {
	s, err := store.NewSchema(schema)
	if err != nil {
		return nil, err
	}
	return &Admin{pool: pool, schema: s}, nil
}

// wake tells the schema's relays to look for work now. What an operator
// action makes claimable is not always a new outbox row, which the
// watcher would see (a replayed fan-out copy, a row un-parked in place, a
// key a purge released): without this, it would wait for the workers'
// safety poll. Best effort: the action has committed already.
func (a *Admin) wake(ctx context.Context) {
	_ = store.NewWaker(a.schema).Notify(ctx, a.pool, "")
}

// ErrEmptySelection is returned by Replay and Purge for a selection that
// names nothing.
var ErrEmptySelection = errors.New("outbox: select dead letters by id, topic or age, or pass all")

// ErrUnknownReason is returned by List, Replay and Purge for a
// selection whose Reason is none of Reasons(): it could only select
// nothing, which an operator would read as "no such dead letters".
var ErrUnknownReason = errors.New("outbox: unknown dead-letter reason")

// ErrConflictingRoutes is returned for a selection that names both the
// default route and another route.
var ErrConflictingRoutes = errors.New("outbox: a selection names one route")

// ErrNotFound is returned by Show for an unknown id.
var ErrNotFound = errors.New("outbox: no such dead letter")

// ErrReplayRoute is returned by ReplayArchive for ToRouteOnly without a
// Route.
var ErrReplayRoute = errors.New("outbox: replay to one route needs the route")
