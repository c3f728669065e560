// Package schemacheck says whether a relay can run on its schema, at
// start and while it runs: someone may migrate the schema to a version
// this relay cannot run on under it, and the relay must then stop
// claiming (neither breaking nor duplicating anything) until a relay
// that knows the schema replaces it; it resumes if the requirement drops
// again (a restore).
package schemacheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
)

// RunsOn reports whether this relay can run on schema at version, whose
// migrations need relays that know at least relayMin.
func RunsOn(schema string, version, relayMin int) error {
	known := migrations.Latest()
	switch {
	case version == 0:
		return fmt.Errorf("%w: schema %q has no outbox tables, this relay needs version %d: run `outbox-relay migrate`", migrations.ErrSchemaMissing, schema, known)
	case version < known:
		return fmt.Errorf("outbox: schema %q is at version %d, this relay needs %d: run `outbox-relay migrate`", schema, version, known)
	case relayMin > known:
		// Its statements may no longer fit the tables: a relay of version
		// 6 on schema 7 failed every settle that held a dead letter and
		// published the batch's other messages again at every cycle.
		return fmt.Errorf("outbox: schema %q is at version %d and needs a relay that knows version %d; this relay knows %d: upgrade the relay", schema, version, relayMin, known)
	}
	return nil
}

// Config is what a Watcher works with.
type Config struct {
	Pool   *pgxpool.Pool
	Schema string
	// Every is how often the requirement is read again (the relay's
	// heartbeat).
	Every time.Duration
	Log   *slog.Logger
	// Changed is called when the relay's verdict changes: err is why it
	// cannot run on the schema now, nil when it can again.
	Changed func(err error)
}

// Watcher re-reads the schema's requirement every Config.Every while it
// runs, and reports when the relay's verdict on it changes.
type Watcher struct {
	service.Loop
	cfg Config
	bad bool
}

// New returns a Watcher of cfg.
func New(cfg Config) (*Watcher, error) {
	if cfg.Pool == nil || cfg.Log == nil || cfg.Changed == nil || cfg.Every <= 0 {
		return nil, errors.New("outbox: schema check: a pool, a logger, a callback and an interval are required")
	}
	return &Watcher{cfg: cfg}, nil
}

// Start watches the schema until ctx ends or Stop.
func (w *Watcher) Start(ctx context.Context) error {
	return w.StartLoop(ctx, func(ctx context.Context) {
		service.Every(ctx, w.cfg.Every, func() { w.check(ctx) })
	})
}

// check reads the requirement once and reports a change of verdict.
func (w *Watcher) check(ctx context.Context) {
	version, relayMin, err := migrations.Requirement(ctx, w.cfg.Pool, w.cfg.Schema)
	if err != nil {
		return // the database is away; the workers will say so
	}
	err = RunsOn(w.cfg.Schema, version, relayMin)
	switch {
	case err != nil && !w.bad:
		w.cfg.Log.Error("schema changed under the relay; claiming nothing until a relay that knows it replaces this one", "error", err)
		w.bad = true
		w.cfg.Changed(err)
	case err == nil && w.bad:
		w.cfg.Log.Info("schema is compatible again; claiming")
		w.bad = false
		w.cfg.Changed(nil)
	}
}
