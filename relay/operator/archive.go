package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
)

// ArchiveSelection picks archived messages to publish again.
type ArchiveSelection struct {
	// From and To bound the messages' creation time (To exclusive; zero
	// means no bound).
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
	// FromAgo and ToAgo give the same bounds relative to the database's
	// clock (zero: unused).
	FromAgo time.Duration `json:"from_ago_ns,omitempty"`
	ToAgo   time.Duration `json:"to_ago_ns,omitempty"`
	// Topic limits the replay to one topic (empty: all).
	Topic string `json:"topic,omitempty"`
	// NewIDs gives the replayed messages fresh message ids, for consumers
	// that would drop them as duplicates. By default they keep their id.
	NewIDs bool `json:"new_ids,omitempty"`
	// Route limits the replay to the messages that route delivered
	// (empty: all, each message once however many routes delivered it).
	Route string `json:"route,omitempty"`
	// ToRouteOnly sends the replayed messages to Route alone, as fan-out
	// copies, instead of back into the outbox, where every route taking
	// their topic would get them. Use it for a route fed by the fan-out
	// router; a route reading the outbox directly is the only one taking
	// its topics anyway.
	ToRouteOnly bool `json:"to_route_only,omitempty"`
}

// ReplayArchive copies archived messages back into the outbox, in their
// original order, and returns how many. With dryRun it only counts.
func (a *Admin) ReplayArchive(ctx context.Context, sel ArchiveSelection, dryRun bool) (int64, error) {
	if sel.ToRouteOnly && sel.Route == "" {
		return 0, ErrReplayRoute
	}
	f := store.ArchiveFilter{From: sel.From, To: sel.To, FromAgo: sel.FromAgo, ToAgo: sel.ToAgo,
		Topic: sel.Topic, Route: sel.Route, NewIDs: sel.NewIDs}
	replay := a.schema.ReplayArchive
	switch {
	case dryRun:
		replay = a.schema.CountArchived
	case sel.ToRouteOnly:
		replay = a.schema.ReplayArchiveToRoute
	}
	n, err := replay(ctx, a.pool, f)
	if err != nil {
		return 0, ident.SchemaMissing(fmt.Errorf("outbox: replay archive: %w", err), a.schema.Name())
	}
	if !dryRun && n > 0 {
		a.wake(ctx)
	}
	return n, nil
}
