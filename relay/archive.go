package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
)

// maintainArchive creates the archive partitions for today and the next
// two days and drops those older than the retention. Relays serialize on
// an advisory lock so two of them never race on the DDL.
func (r *Relay) maintainArchive(ctx context.Context) error {
	parts := store.NewPartitions(r.schema)
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		now, err := parts.Lock(ctx, tx)
		if err != nil {
			return err
		}
		today := now.UTC().Truncate(24 * time.Hour)
		for d := 0; d < 3; d++ {
			if err := parts.Create(ctx, tx, today.AddDate(0, 0, d)); err != nil {
				return fmt.Errorf("outbox: create archive partition: %w", err)
			}
		}
		names, err := parts.List(ctx, tx)
		if err != nil {
			return err
		}
		cutoff := now.Add(-r.cfg.ArchiveRetention).UTC()
		for _, n := range names {
			day, ok := store.PartitionDay(n)
			if !ok {
				continue // not ours
			}
			if day.AddDate(0, 0, 1).After(cutoff) {
				continue
			}
			if err := parts.Drop(ctx, tx, n); err != nil {
				return fmt.Errorf("outbox: drop archive partition %s: %w", n, err)
			}
			r.log.Info("archive partition dropped", "partition", n)
		}
		return nil
	})
}

// keepArchive runs maintainArchive every ten minutes until ctx ends: the
// next days' partitions exist well before the first delivery of the day.
func (r *Relay) keepArchive(ctx context.Context) {
	service.Every(ctx, 10*time.Minute, func() {
		if err := r.maintainArchive(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("archive maintenance failed", "error", err)
		}
	})
}
