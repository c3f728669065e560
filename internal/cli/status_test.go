package cli_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Issue 20, bug 9: with a registered relay whose heartbeat is 'infinity'
// and lane rows deleted, status failed (cannot scan Infinity) and, before
// that, said nothing about lanes nobody works.
func TestStatusShowsLanesNobodyWorks(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.relays (id, hostname, pid, version, heartbeat_at, backend_pid)
		VALUES ('stuck', 'h', 1, 'v', 'infinity', 1)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM `+s+`.lanes WHERE lane < 6`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, payload, created_at) VALUES ('t', 'x', 'infinity')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "LANES OF ROUTE")
	require.Contains(t, out, "lanes held by no live relay: 256")
	require.Contains(t, out, `WARNING: route "": 256 lanes worked by no live relay (6 lane rows missing)`)
	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"missing": 6`)
}
