package relay_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// recordMigration marks the schema as migrated to version, needing relays
// that know relayMin: what `migrate` of a future release would leave.
func (e *env) recordMigration(version, relayMin int) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(),
		"INSERT INTO "+e.table("schema_migrations")+" (version, name, relay_min) VALUES ($1, 'future', $2)", version, relayMin)
	require.NoError(e.t, err)
}

// A relay refuses to start on a schema that needs a newer relay, and
// runs on one that is newer but declared compatible.
func TestRelayRefusesASchemaThatNeedsANewerRelay(t *testing.T) {
	t.Parallel()
	next := migrations.Latest() + 1
	e := setup(t)
	e.recordMigration(next, next)
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: 2})
	require.NoError(t, err)
	defer pool.Close()
	r, err := relay.New(pool, e.sink, e.config())
	require.NoError(t, err)
	err = r.Run(waitCtx(t, 10*time.Second))
	require.ErrorContains(t, err, "needs a relay that knows version")
	require.ErrorContains(t, err, "upgrade the relay")

	c := setup(t)
	c.recordMigration(next, migrations.Latest())
	c.write(msg("t", "k", "a"))
	c.start(c.config(), c.sink)
	require.NoError(t, c.sink.WaitFor(waitCtx(t, 20*time.Second), 1))
}

// A schema migrated under a running relay to a version the relay cannot
// run on stops it from claiming (no duplicate storm, nothing lost) and
// makes it unready with the reason, until the requirement is gone.
func TestRelayStopsClaimingWhenTheSchemaOutgrowsIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r, _ := e.start(e.config(), e.sink)
	e.write(msg("t", "k", "before"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 1))

	next := migrations.Latest() + 1
	e.recordMigration(next, next)
	eventually(t, 10*time.Second, func() bool { return r.Ready(context.Background()) != nil }, "relay still ready")
	require.ErrorContains(t, r.Ready(context.Background()), "upgrade the relay")
	// Every worker has seen it (a claim that began before it did may
	// still be under way until then).
	for w := range e.config().Workers {
		r.AwaitSignal(t, signalBound, relay.SigSchemaHold, 0, func(v int) bool { return v == w })
	}
	e.write(msg("t", "k", "during"))
	// Several heartbeats (and polls, one every heartbeat's fourth):
	// nothing is claimed.
	r.AwaitSignal(t, signalBound, relay.SigLeaseHeld, r.SignalCount(relay.SigLeaseHeld)+4, nil)
	require.Len(t, e.sink.Delivered(), 1)
	require.Equal(t, 1, e.count("messages"))

	_, err := e.pool.Exec(context.Background(), "DELETE FROM "+e.table("schema_migrations")+" WHERE version = $1", next)
	require.NoError(t, err)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 2))
	require.NoError(t, r.Ready(context.Background()))
}

// A relay on a schema that was never migrated refuses to start with
// outbox.ErrSchemaMissing and says what to run.
func TestRelayRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: 1})
	require.NoError(t, err)
	defer pool.Close()
	r, err := relay.New(pool, memory.New(), relay.Config{Schema: pgtest.SchemaName(t), Workers: 1})
	require.NoError(t, err)
	err = r.Run(waitCtx(t, 10*time.Second))
	require.ErrorIs(t, err, outbox.ErrSchemaMissing)
	require.ErrorContains(t, err, "run `outbox-relay migrate`")
}

// A database that refuses the relay for good (no such database, no such
// role) fails the start at once with the reason, instead of being retried
// for ConnectTimeout as "not reachable yet".
func TestRelayFailsAtOnceWhenTheDatabaseRefusesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, url, want string }{
		{"no such database", withDatabase(t, pgtest.URL(), "outbox_no_such_db"), "the database does not exist"},
		{"no such role", withUser(t, pgtest.URL(), "outbox_no_such_role"), "refuses this role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: tc.url, Workers: 1})
			require.NoError(t, err)
			defer pool.Close()
			r, err := relay.New(pool, memory.New(), relay.Config{Workers: 1, ConnectTimeout: time.Hour})
			require.NoError(t, err)
			err = r.Run(waitCtx(t, 20*time.Second))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func withDatabase(t *testing.T, raw, db string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.Path = "/" + db
	return u.String()
}

func withUser(t *testing.T, raw, user string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.User(user)
	return u.String()
}
