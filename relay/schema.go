package relay

import (
	"context"
	"fmt"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
)

// runsOn reports whether this relay can run on a schema at version whose
// migrations need relays that know at least relayMin.
func (r *Relay) runsOn(version, relayMin int) error {
	known := migrations.Latest()
	switch {
	case version == 0:
		return fmt.Errorf("%w: schema %q has no outbox tables, this relay needs version %d: run `outbox-relay migrate`", migrations.ErrSchemaMissing, r.cfg.Schema, known)
	case version < known:
		return fmt.Errorf("outbox: schema %q is at version %d, this relay needs %d: run `outbox-relay migrate`", r.cfg.Schema, version, known)
	case relayMin > known:
		// Its statements may no longer fit the tables: a relay of version
		// 6 on schema 7 failed every settle that held a dead letter and
		// published the batch's other messages again at every cycle.
		return fmt.Errorf("outbox: schema %q is at version %d and needs a relay that knows version %d; this relay knows %d: upgrade the relay", r.cfg.Schema, version, relayMin, known)
	}
	return nil
}

// watchSchema re-reads the schema's requirement at every heartbeat: when
// someone migrates the schema to a version this relay cannot run on while
// it runs, the workers stop claiming and Ready fails with the reason, so
// that the old relay neither breaks nor duplicates anything until it is
// replaced. It resumes if the requirement drops again (a restore).
func (r *Relay) watchSchema(ctx context.Context) {
	service.Every(ctx, r.cfg.Heartbeat, func() {
		version, relayMin, err := migrations.Requirement(ctx, r.pool, r.cfg.Schema)
		if err != nil {
			return // the database is away; the workers will say so
		}
		err = r.runsOn(version, relayMin)
		switch prev := r.schemaErr.Load(); {
		case err != nil && prev == nil:
			r.log.Error("schema changed under the relay; claiming nothing until a relay that knows it replaces this one", "error", err)
			r.schemaErr.Store(&err)
		case err == nil && prev != nil:
			r.log.Info("schema is compatible again; claiming")
			r.schemaErr.Store(nil)
			r.wakeAll()
		}
	})
}
