// Package archive keeps the archive table's daily partitions: the next
// days' exist before their first delivery is archived, and those older
// than the retention are dropped. Relays serialize on an advisory lock,
// so two of them never race on the DDL.
package archive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
)

// Config is what a Keeper works with.
type Config struct {
	Pool   *pgxpool.Pool
	Schema store.Schema
	// Retention is how long archived messages are kept: a day's partition
	// goes once its last message is older.
	Retention time.Duration
	Log       *slog.Logger
	// Every is how often Start's loop maintains the partitions. Default
	// ten minutes: the next days' partitions exist well before the first
	// delivery of the day.
	Every time.Duration
}

// Keeper maintains the archive's partitions.
type Keeper struct {
	service.Loop
	cfg   Config
	parts store.Partitions
}

// New returns a Keeper of cfg.
func New(cfg Config) (*Keeper, error) {
	if cfg.Pool == nil || cfg.Log == nil {
		return nil, errors.New("outbox: archive: a pool and a logger are required")
	}
	if cfg.Retention < 24*time.Hour {
		return nil, fmt.Errorf("outbox: archive-retention: must be at least 24h (partitions are daily), got %s", cfg.Retention)
	}
	if cfg.Every == 0 {
		cfg.Every = 10 * time.Minute
	}
	return &Keeper{cfg: cfg, parts: store.NewPartitions(cfg.Schema)}, nil
}

// Start maintains the partitions every Config.Every until ctx ends or
// Stop (not at once: call Maintain first, so that the relay does not
// deliver before today's partition exists).
func (k *Keeper) Start(ctx context.Context) error {
	return k.StartLoop(ctx, func(ctx context.Context) {
		service.Every(ctx, k.cfg.Every, func() {
			if err := k.Maintain(ctx); err != nil && ctx.Err() == nil {
				k.cfg.Log.Warn("archive maintenance failed", "error", err)
			}
		})
	})
}

// Maintain creates the partitions for today and the next two days and
// drops those older than the retention.
func (k *Keeper) Maintain(ctx context.Context) error {
	parts := k.parts
	return pgx.BeginFunc(ctx, k.cfg.Pool, func(tx pgx.Tx) error {
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
		cutoff := now.Add(-k.cfg.Retention).UTC()
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
			k.cfg.Log.Info("archive partition dropped", "partition", n)
		}
		return nil
	})
}
