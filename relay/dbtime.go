package relay

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Timestamps in the relay's tables are written by the database (now()),
// but a row edited by hand may hold 'infinity' or '-infinity', which pgx
// refuses to scan into a time.Time ("cannot scan Infinity"). A message's
// CreatedAt goes through finiteTime, so that one such row cannot stall a
// worker: it becomes the claim's database time (sinks get a real, current
// time, which brokers accept as a record timestamp). The operator views
// (package relay/operator) show the zero time instead.

// finiteTime returns ts, or instead when ts is ±infinity or NULL.
func finiteTime(ts pgtype.Timestamptz, instead time.Time) time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return instead
	}
	return ts.Time
}
