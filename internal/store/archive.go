package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The archive's partitions: one per UTC day, created ahead of the
// deliveries that go into them and dropped after the retention. When and
// which is the relay's decision (package relay, archive.go); these are
// its statements.

// archiveLockKey is the first half of the advisory lock that serializes
// partition maintenance over every relay of a schema ("outc").
const archiveLockKey = 0x6f757463

// partitionPrefix begins the name of every partition the relay manages.
const partitionPrefix = "archive_p"

// Partitions maintains schema s's archive partitions.
type Partitions struct{ s Schema }

// NewPartitions returns the partition statements of schema s.
func NewPartitions(s Schema) Partitions { return Partitions{s: s} }

// PartitionName names the archive partition of day (UTC).
func PartitionName(day time.Time) string {
	return partitionPrefix + day.UTC().Format("20060102")
}

// PartitionDay is the day of a partition named by PartitionName; false for
// any other table.
func PartitionDay(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, partitionPrefix)
	if !ok {
		return time.Time{}, false
	}
	day, err := time.Parse("20060102", rest)
	return day, err == nil
}

// Lock takes the schema's maintenance lock for the rest of tx (relays then
// never race on the DDL) and returns the transaction's time.
func (p Partitions) Lock(ctx context.Context, tx pgx.Tx) (time.Time, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(@key, hashtext(@schema))`,
		pgx.NamedArgs{"key": archiveLockKey, "schema": p.s.Name()}); err != nil {
		return time.Time{}, err
	}
	var now time.Time
	err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// Create creates the partition of day (UTC) unless it exists.
func (p Partitions) Create(ctx context.Context, q Querier, day time.Time) error {
	_, err := q.Exec(ctx, p.createSQL(day))
	return err
}

// createSQL is DDL: it takes no parameters, so the bounds are written as
// literals, formatted from a time.Time (never from input).
func (p Partitions) createSQL(day time.Time) string {
	from := day.UTC().Truncate(24 * time.Hour)
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		p.s.Table(PartitionName(from)), p.s.Table("archive"), from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339))
}

// List returns the names of the archive's partitions, the relay's and any
// other.
func (p Partitions) List(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE p.relname = 'archive' AND n.nspname = @schema`, pgx.NamedArgs{"schema": p.s.Name()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Drop drops the partition name.
func (p Partitions) Drop(ctx context.Context, q Querier, name string) error {
	_, err := q.Exec(ctx, "DROP TABLE "+p.s.Table(name))
	return err
}
