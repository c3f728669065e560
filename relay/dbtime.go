package relay

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Timestamps in the relay's tables are written by the database (now()),
// but a row edited by hand may hold 'infinity' or '-infinity', which pgx
// refuses to scan into a time.Time ("cannot scan Infinity"). Everything
// the relay and the operator commands read as a time goes through
// finiteTime, so that one such row cannot stall a worker or break
// `status`:
//
//   - a message's CreatedAt is the claim's database time (sinks get a
//     real, current time, which brokers accept as a record timestamp);
//   - operator views show the zero time.Time (JSON 0001-01-01T00:00:00Z)
//     for a timestamp that is not finite, heartbeats and ages are bounded
//     by the database's clock in SQL.

// finiteTime returns ts, or instead when ts is ±infinity or NULL.
func finiteTime(ts pgtype.Timestamptz, instead time.Time) time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return instead
	}
	return ts.Time
}

// finiteTimePtr is finiteTime for a nullable column: nil for NULL or
// ±infinity.
func finiteTimePtr(ts pgtype.Timestamptz) *time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return nil
	}
	t := ts.Time
	return &t
}
