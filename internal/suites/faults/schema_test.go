package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// TestHostileSchemaName runs the whole command line (migrate, run, status,
// dlq list/show/replay/purge) on a schema whose name is an SQL injection
// attempt. Every statement must quote it; a sentinel table that the name
// tries to drop must survive, and the outbox must work as usual.
func TestHostileSchemaName(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	sentinel := testkit.RandName("faults_sentinel_")
	schema := `we"ird'; DROP TABLE ` + sentinel + `; --`
	require.NoError(t, migrations.ValidateSchema(schema))
	_, err := pool.Exec(ctx, "CREATE TABLE public."+sentinel+" (x int)")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, q := range []string{"DROP SCHEMA IF EXISTS " + migrations.Ident(schema) + " CASCADE", "DROP TABLE IF EXISTS public." + sentinel} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	base := []string{"--database-url", pgtest.URL(), "--schema", schema}
	runCLI := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := cli(t, append(args, base...)...)
		require.Equal(t, 0, code, "outbox-relay %v: %s", args, stderr)
		return stdout
	}

	runCLI("migrate")
	runCLI("migrate") // idempotent
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.GreaterOrEqual(t, tables, 4, "the schema has its tables, under its literal name")

	// A plain-SQL writer and the Go writer, both with the name quoted.
	for i := 0; i < 20; i++ {
		_, err := pool.Exec(ctx, `SELECT `+migrations.Ident(schema)+`.enqueue($1, $2, $3::text)`, "orders", fmt.Sprintf("k%d", i%4), payloadOf("orders", fmt.Sprintf("k%d", i%4), i))
		require.NoError(t, err)
	}
	want := commit(t, pool, schema, messages("orders", keyNames("g", 4), 100, 20, map[string]string{"type": "x"}))
	commit(t, pool, schema, messages("reject", []string{"bad"}, 0, 2, nil))

	rc := newReceiver(t, func(r *http.Request, body []byte) (int, string) {
		if strings.HasPrefix(string(body), "reject|") {
			return http.StatusUnprocessableEntity, "rejected"
		}
		return http.StatusNoContent, ""
	})
	p := startRelay(t, pgtest.URL(), schema, "--sink", rc.url(), "--exit-when-empty")
	require.Equal(t, 0, p.wait(60*time.Second), p.logs.tail(20))
	require.Equal(t, 40, distinct(rc.deliveries()))
	checkAllDelivered(t, want, rc.deliveries())

	var st operator.Status
	require.NoError(t, json.Unmarshal([]byte(runCLI("status", "--json")), &st))
	require.Zero(t, st.Pending)
	require.EqualValues(t, 2, st.DeadLetters)

	var dls []operator.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(runCLI("dlq", "list", "--json")), &dls))
	require.Len(t, dls, 2)
	show := runCLI("dlq", "show", fmt.Sprint(dls[0].ID))
	require.Contains(t, show, "422")

	require.Contains(t, runCLI("dlq", "replay", "--id", fmt.Sprint(dls[0].ID)), "replayed 1")
	require.Contains(t, runCLI("dlq", "purge", "--id", fmt.Sprint(dls[1].ID)), "purged 1")
	require.Equal(t, 1, count(t, pool, schema, "messages"), "the replayed dead letter is back in the outbox")
	require.Zero(t, count(t, pool, schema, "dead_letters"))

	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+sentinel).Scan(&exists))
	require.True(t, exists, "the sentinel table survived")
	t.Logf("schema %q: migrate, run (40 delivered, 2 dead-lettered), status, dlq list/show/replay/purge all worked; sentinel table intact", schema)
}
