package operator

import (
	"context"
	"fmt"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
)

// Gauges is what the backlog gauges of package relayprom show: the
// outbox's totals, counted as Status counts them, and the held keys of
// each route that holds some.
type Gauges struct {
	Backlog
	Held []HeldStatus
}

// Gauges reads the totals and the held keys in two statements, without
// the scan per topic and route of Status: cheap enough to refresh the
// metrics every few seconds.
func (a *Admin) Gauges(ctx context.Context) (Gauges, error) {
	t, err := a.schema.Totals(ctx, a.pool)
	if err != nil {
		return Gauges{}, ident.SchemaMissing(fmt.Errorf("outbox: backlog totals: %w", err), a.schema.Name())
	}
	held, err := a.schema.HeldRoutes(ctx, a.pool)
	if err != nil {
		return Gauges{}, ident.SchemaMissing(fmt.Errorf("outbox: held keys: %w", err), a.schema.Name())
	}
	return Gauges{
		Backlog: Backlog{Pending: t.Pending, Ready: t.Ready, Retrying: t.Retrying, Delayed: t.Delayed,
			OldestAge: t.OldestAge, DeadLetters: t.DeadLetters},
		Held: convert(held, func(h store.HeldRoute) HeldStatus { return HeldStatus(h) }),
	}, nil
}
