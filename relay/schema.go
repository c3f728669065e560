package relay

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/internal/schemacheck"
)

// watchSchema starts re-reading the schema's requirement at every
// heartbeat: when someone migrates the schema to a version this relay
// cannot run on while it runs, changed gets why (the relay's workers then
// stop claiming and Ready fails with the reason, so that the old relay
// neither breaks nor duplicates anything until it is replaced), and nil
// once it can run again (a restore). stop ends the watcher and waits for
// it.
func watchSchema(ctx context.Context, pool *pgxpool.Pool, cfg Config, log *slog.Logger, changed func(error)) (stop func(), err error) {
	w, err := schemacheck.New(schemacheck.Config{Pool: pool, Schema: cfg.Schema, Every: cfg.Heartbeat, Log: log, Changed: changed})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return w.Stop, nil
}
