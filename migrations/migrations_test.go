package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func TestApplyIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaName(t)
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+migrations.Ident(schema)+" CASCADE")
	})

	var wg sync.WaitGroup
	results := make([][]int, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Apply(ctx, pool, schema)
		}()
	}
	wg.Wait()
	applied := 0
	for i := range results {
		require.NoError(t, errs[i])
		applied += len(results[i])
	}
	require.Equal(t, migrations.Latest(), applied, "each migration applied exactly once across concurrent callers")

	again, err := migrations.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, again)

	v, err := migrations.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

func TestHostileSchemaName(t *testing.T) {
	t.Parallel()
	schema := `we"ird'; DROP TABLE x; --` + pgtest.SchemaName(t)[:8]
	pool, _ := pgtest.SchemaNamed(t, schema)
	ctx := context.Background()
	var id string
	err := pool.QueryRow(ctx, "SELECT "+migrations.Ident(schema)+".enqueue('orders', '42', '{\"a\":1}'::jsonb)::text").Scan(&id)
	require.NoError(t, err)
	require.Len(t, id, 36)
}

func TestEnqueueOverloadsAndHeaderCheck(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	s := migrations.Ident(schema)

	for _, q := range []string{
		`SELECT ` + s + `.enqueue('orders', '42', '{"a":1}'::jsonb)`,
		`SELECT ` + s + `.enqueue('orders', '42', 'plain text')`,
		`SELECT ` + s + `.enqueue('orders', NULL, '\x00ff'::bytea, '{"h":"v"}')`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	var payload []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT payload FROM `+s+`.messages ORDER BY id LIMIT 1`).Scan(&payload))
	require.Equal(t, `{"a": 1}`, string(payload))

	for _, tc := range []struct{ headers, want string }{
		{`'[]'`, "must be a JSON object"},
		{`'{"a":1}'`, `header "a" must be a string, got number`},
		{`'{"a":{"b":"c"}}'`, `header "a" must be a string, got object`},
		{`'"x"'`, "must be a JSON object"},
		{`'{"":"v"}'`, "header names must not be empty"},
		{`'{"a":"1","b":null}'`, `header "b" must be a string, got null`},
		{`'{"a":["x"]}'`, `header "a" must be a string, got array`},
	} {
		_, err := pool.Exec(ctx, `SELECT `+s+`.enqueue('t', 'k', 'p', `+tc.headers+`)`)
		require.Error(t, err, tc.headers)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23514", pgErr.Code)
		require.Contains(t, pgErr.Message, tc.want)
	}
	_, err := pool.Exec(ctx, `SELECT `+s+`.enqueue('', 'k', 'p')`)
	require.ErrorContains(t, err, "messages_topic_not_empty")
}

func TestScriptMatchesApply(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaName(t)
	script, err := migrations.Script(schema)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(script, "-- outbox-relay schema"))
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+migrations.Ident(schema)+" CASCADE")
	})
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Conn().PgConn().Exec(ctx, script).ReadAll()
	require.NoError(t, err)
	// A database prepared by the printed script is current for migrate.
	applied, err := migrations.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, applied)
}

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	require.Error(t, migrations.ValidateSchema(""))
	require.Error(t, migrations.ValidateSchema(strings.Repeat("x", 60)))
	require.NoError(t, migrations.ValidateSchema("outbox"))
}

// The headers constraint decides most inserts with plain SQL and calls
// check_headers only for headers that fail it: both must accept exactly
// the same headers.
func TestHeadersConstraintAgreesWithCheckHeaders(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	s := migrations.Ident(schema)
	for _, h := range []string{
		`{}`, `{"a":"b"}`, `{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","type":"OrderPlaced"}`,
		`{"a":""}`, `{" ":"x"}`, `{"a":"b","c":1}`, `{"":"x"}`, `{"":""}`, `{"a":null}`, `{"a":true}`,
		`{"a":{}}`, `{"a":[]}`, `{"a":"x","b":{"c":"d"}}`, `[]`, `["a"]`, `"s"`, `1`, `null`, `true`,
		`{"ü":"ß"}`, `{"a\u0000b":"c"}`,
	} {
		var fnOK bool
		_, fnErr := pool.Exec(ctx, `SELECT `+s+`.check_headers($1::jsonb)`, h)
		fnOK = fnErr == nil
		_, insErr := pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, key, payload, headers) VALUES ('t', 'k', 'p', $1::jsonb)`, h)
		require.Equal(t, fnOK, insErr == nil, "headers %s: check_headers error %v, insert error %v", h, fnErr, insErr)
		if insErr != nil {
			// The writer gets check_headers' own message.
			require.Equal(t, fnErr.Error(), insErr.Error(), h)
		}
	}
}
