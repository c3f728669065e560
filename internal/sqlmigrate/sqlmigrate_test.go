package sqlmigrate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/sqlmigrate"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// set returns a Set over files whose templates see .Schema.
func set(files fstest.MapFS) *sqlmigrate.Set {
	return &sqlmigrate.Set{
		Files:    files,
		Glob:     "sql/*.up.sql",
		Validate: func(string) error { return nil },
		Data:     func(schema string) any { return map[string]string{"Schema": ident.Quote(schema)} },
		Table:    "test_migrations",
		LockKey:  0x74657374, // "test"
		Prefix:   "outbox: test",
		Header:   func(schema string) string { return "-- test tables for " + schema + "\n" },
	}
}

func file(text string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(text)} }

func TestLoadRendersInFileOrder(t *testing.T) {
	t.Parallel()
	ms, err := set(fstest.MapFS{
		"sql/010_third.up.sql":  file("SELECT 3 FROM {{.Schema}}.t;\n"),
		"sql/001_first.up.sql":  file("CREATE TABLE {{.Schema}}.t ();\n"),
		"sql/002_second.up.sql": file("SELECT 2;\n"),
		"sql/003_skipped.sql":   file("not a migration"),
		"other/004_x.up.sql":    file("not in the glob"),
	}).Load(`we"ird`)
	require.NoError(t, err)
	require.Equal(t, []sqlmigrate.Migration{
		{Version: 1, Name: "first", SQL: `CREATE TABLE "we""ird".t ();` + "\n"},
		{Version: 2, Name: "second", SQL: "SELECT 2;\n"},
		{Version: 10, Name: "third", SQL: `SELECT 3 FROM "we""ird".t;` + "\n"},
	}, ms)
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		files fstest.MapFS
		want  string
	}{
		"no number": {
			fstest.MapFS{"sql/init.up.sql": file("SELECT 1;")},
			`outbox: test: migration file "init.up.sql": name must start with a number`,
		},
		"no underscore": {
			fstest.MapFS{"sql/001.up.sql": file("SELECT 1;")},
			`outbox: test: migration file "001.up.sql": name must start with a number`,
		},
		"template syntax": {
			fstest.MapFS{"sql/001_a.up.sql": file("SELECT {{.Schema")},
			"outbox: test: migration 001_a.up.sql: template: 001_a.up.sql:1: unclosed action",
		},
		"missing key": {
			fstest.MapFS{"sql/001_a.up.sql": file("NOTIFY {{.Channel}};")},
			`outbox: test: migration 001_a.up.sql: template: 001_a.up.sql:1:9: executing "001_a.up.sql" at <.Channel>: map has no entry for key "Channel"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := set(tc.files).Load("s")
			require.EqualError(t, err, tc.want)
		})
	}
}

func TestLoadRefusesAnInvalidSchema(t *testing.T) {
	t.Parallel()
	invalid := errors.New("outbox: test: Schema: invalid")
	s := set(fstest.MapFS{"sql/001_a.up.sql": file("SELECT 1;")})
	s.Validate = func(string) error { return invalid }
	_, err := s.Load("s")
	require.ErrorIs(t, err, invalid)
	_, err = s.Script("s")
	require.ErrorIs(t, err, invalid)
}

// minColumn is an Extra column read from a first line "-- min: N",
// which defaults to the migration's own version.
var minColumn = &sqlmigrate.Column{Name: "min", Value: func(m sqlmigrate.Migration) (int, error) {
	line, _, _ := strings.Cut(m.SQL, "\n")
	v, ok := strings.CutPrefix(line, "-- min: ")
	if !ok {
		return m.Version, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n > m.Version {
		return 0, fmt.Errorf("min must be a version up to %d", m.Version)
	}
	return n, nil
}}

func TestExtraColumn(t *testing.T) {
	t.Parallel()
	s := set(fstest.MapFS{
		"sql/001_a.up.sql": file("SELECT 1;\n"),
		"sql/002_b.up.sql": file("-- min: 1\nSELECT 2;\n"),
	})
	s.Extra = minColumn
	ms, err := s.Load("s")
	require.NoError(t, err)
	require.Equal(t, []int{1, 1}, []int{ms[0].Extra, ms[1].Extra})
	script, err := s.Script("s")
	require.NoError(t, err)
	require.Equal(t, `-- test tables for s
BEGIN;
CREATE SCHEMA IF NOT EXISTS "s";
CREATE TABLE IF NOT EXISTS "s".test_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE "s".test_migrations ADD COLUMN IF NOT EXISTS min integer;

-- 001_a
SELECT 1;
INSERT INTO "s".test_migrations (version, name, min) VALUES (1, 'a', 1);

-- 002_b
-- min: 1
SELECT 2;
INSERT INTO "s".test_migrations (version, name, min) VALUES (2, 'b', 1);
COMMIT;
`, script)

	s.Files = fstest.MapFS{"sql/001_a.up.sql": file("-- min: 2\nSELECT 1;\n")}
	_, err = s.Load("s")
	require.EqualError(t, err, "outbox: test: migration 001_a.up.sql: min must be a version up to 1")
}

// TestApply runs a set against the test database: the steps around the
// migrations run in its transaction, a second Apply finds nothing to do,
// and a failing migration leaves nothing behind.
func TestApply(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	schema := pgtest.SchemaName(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE")
	})
	files := fstest.MapFS{
		"sql/001_t.up.sql":    file("CREATE TABLE {{.Schema}}.t (n int);\n"),
		"sql/002_more.up.sql": file("-- min: 1\nINSERT INTO {{.Schema}}.t VALUES (2);\n"),
	}
	s := set(files)
	s.Extra = minColumn
	var steps []string
	s.Before = func(ctx context.Context, tx pgx.Tx, schema string) error {
		var exists bool
		err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ident.Quote(schema)+".t").Scan(&exists)
		steps = append(steps, fmt.Sprintf("before: t exists %v", exists))
		return err
	}
	s.After = func(ctx context.Context, tx pgx.Tx, schema string) error {
		var n int
		err := tx.QueryRow(ctx, "SELECT count(*) FROM "+ident.Quote(schema)+".t").Scan(&n)
		steps = append(steps, fmt.Sprintf("after: %d rows", n))
		return err
	}

	applied, err := s.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, applied)
	require.Equal(t, []string{"before: t exists false", "after: 1 rows"}, steps)
	rows, err := pool.Query(ctx, "SELECT version, name, min FROM "+ident.Quote(schema)+".test_migrations ORDER BY version")
	require.NoError(t, err)
	type record struct {
		Version int
		Name    string
		Min     int
	}
	recorded, err := pgx.CollectRows(rows, pgx.RowToStructByPos[record])
	require.NoError(t, err)
	require.Equal(t, []record{{1, "t", 1}, {2, "more", 1}}, recorded)

	applied, err = s.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, applied)

	// A migration that fails, and an After step that fails, leave nothing.
	u := ident.Quote(schema) + ".u"
	uExists := func() bool {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", u).Scan(&exists))
		return exists
	}
	files["sql/003_broken.up.sql"] = file("CREATE TABLE {{.Schema}}.u (n int);\nSELECT nonsense;\n")
	_, err = s.Apply(ctx, pool, schema)
	require.ErrorContains(t, err, "outbox: test: migrate: 003_broken: ")
	require.False(t, uExists(), "the failed migration rolled back")

	delete(files, "sql/003_broken.up.sql")
	files["sql/003_u.up.sql"] = file("CREATE TABLE {{.Schema}}.u (n int);\n")
	stop := errors.New("stop")
	s.After = func(context.Context, pgx.Tx, string) error { return stop }
	_, err = s.Apply(ctx, pool, schema)
	require.ErrorIs(t, err, stop)
	require.False(t, uExists(), "After runs in the migrations' transaction")
}
