package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// archivePartition names the archive partition of one UTC day.
func archivePartition(day time.Time) string {
	return "archive_p" + day.UTC().Format("20060102")
}

// maintainArchive creates the archive partitions for today and the next
// two days and drops those older than the retention. Relays serialize on
// an advisory lock so two of them never race on the DDL.
func (r *Relay) maintainArchive(ctx context.Context) error {
	s := migrations.Ident(r.cfg.Schema)
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", archiveLockKey, r.cfg.Schema); err != nil {
			return err
		}
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return err
		}
		today := now.UTC().Truncate(24 * time.Hour)
		for d := 0; d < 3; d++ {
			from := today.AddDate(0, 0, d)
			name := migrations.Ident(r.cfg.Schema) + "." + pgx.Identifier{archivePartition(from)}.Sanitize()
			sql := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s.archive FOR VALUES FROM ('%s') TO ('%s')",
				name, s, from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339))
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("outbox: create archive partition: %w", err)
			}
		}
		rows, err := tx.Query(ctx, `
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE p.relname = 'archive' AND n.nspname = $1`, r.cfg.Schema)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		cutoff := now.Add(-r.cfg.ArchiveRetention).UTC()
		for _, n := range names {
			day, err := time.Parse("20060102", strings.TrimPrefix(n, "archive_p"))
			if err != nil || !strings.HasPrefix(n, "archive_p") {
				continue // not ours
			}
			if day.AddDate(0, 0, 1).After(cutoff) {
				continue
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+s+"."+pgx.Identifier{n}.Sanitize()); err != nil {
				return fmt.Errorf("outbox: drop archive partition %s: %w", n, err)
			}
			r.log.Info("archive partition dropped", "partition", n)
		}
		return nil
	})
}

const archiveLockKey = 0x6f757463 // "outc"
