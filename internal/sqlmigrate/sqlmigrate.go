// Package sqlmigrate renders and applies a set of numbered SQL migrations
// for a schema: the machinery that package migrations (the outbox's
// tables) and package inbox (the inbox's tables) share. A Set says what
// differs between them: the files, what their templates see, the version
// table, the advisory lock, the error prefix and the steps around the
// migrations. The files and tables themselves live with their packages.
//
// Outside the standard library it imports only pgx and internal/ident, so
// that package inbox still imports nothing of the relay or the sinks.
package sqlmigrate

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// Migration is one rendered migration.
type Migration struct {
	Version int
	Name    string // the file name without its number and ".up.sql"
	SQL     string
	// Extra is the migration's value for the Set's Extra column; 0 when
	// the Set has none.
	Extra int
}

// Column is an integer column of the version table beside version and
// name. It is added with ADD COLUMN IF NOT EXISTS, so that a version table
// created before it gains it (NULL in the rows recorded until then).
type Column struct {
	Name string // an SQL identifier that needs no quoting, e.g. "relay_min"
	// Value returns m's value for the column. Its error is returned
	// prefixed with the file's name.
	Value func(m Migration) (int, error)
}

// Set is one family of migrations: files named NNN_name.up.sql, each a
// text/template rendered for a schema, recorded in a version table in that
// schema once applied.
type Set struct {
	// Files holds the migrations; Glob (fs.Glob's syntax) picks them out,
	// e.g. "*.up.sql" or "migrations/*.up.sql". They run in the order of
	// their file names, so numbers are zero-padded.
	Files fs.FS
	Glob  string
	// Validate checks a schema name before anything is rendered; its
	// error is returned as it is.
	Validate func(schema string) error
	// Data is what the templates see for schema. A key a template names
	// and Data lacks is an error, never an empty string.
	Data func(schema string) any
	// Table is the version table's name in the schema, e.g.
	// "schema_migrations"; it needs no quoting.
	Table string
	// Extra, when set, is one more column of the version table.
	Extra *Column
	// LockKey is the first half of the advisory lock under which Apply
	// runs (the second is a hash of the schema name), so that it does not
	// wait on another Set's migrations of the same schema.
	LockKey int32
	// Prefix starts every error this package makes, e.g. "outbox" for
	// "outbox: migrate: lock: …" and "outbox: migration 001_init.up.sql: …".
	Prefix string
	// Header returns the script's first lines, before BEGIN; Footer (may
	// be nil) the lines before COMMIT. Both end in a newline.
	Header, Footer func(schema string) string
	// Before (may be nil) runs in Apply's transaction before the lock is
	// taken; After (may be nil) after the last migration is recorded,
	// before the commit. Their errors are returned as they are.
	Before, After func(ctx context.Context, tx pgx.Tx, schema string) error
}

// Load renders every migration of the set for schema, in version order.
func (s *Set) Load(schema string) ([]Migration, error) {
	if err := s.Validate(schema); err != nil {
		return nil, err
	}
	paths, err := fs.Glob(s.Files, s.Glob)
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	data := s.Data(schema)
	var out []Migration
	for _, p := range paths {
		m, err := s.render(p, data)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// render reads the file at p and renders it with data.
func (s *Set) render(p string, data any) (Migration, error) {
	file := path.Base(p)
	num, rest, ok := strings.Cut(file, "_")
	v, err := strconv.Atoi(num)
	if !ok || err != nil {
		return Migration{}, fmt.Errorf("%s: migration file %q: name must start with a number", s.Prefix, file)
	}
	raw, err := fs.ReadFile(s.Files, p)
	if err != nil {
		return Migration{}, err
	}
	tmpl, err := template.New(file).Option("missingkey=error").Parse(string(raw))
	if err != nil {
		return Migration{}, fmt.Errorf("%s: migration %s: %w", s.Prefix, file, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		return Migration{}, fmt.Errorf("%s: migration %s: %w", s.Prefix, file, err)
	}
	m := Migration{Version: v, Name: strings.TrimSuffix(rest, ".up.sql"), SQL: buf.String()}
	if s.Extra != nil {
		if m.Extra, err = s.Extra.Value(m); err != nil {
			return Migration{}, fmt.Errorf("%s: migration %s: %w", s.Prefix, file, err)
		}
	}
	return m, nil
}

// table is the version table, qualified with schema.
func (s *Set) table(schema string) string { return ident.Quote(schema) + "." + s.Table }

// versionTableDDL creates schema and its version table where they do not
// exist yet.
func (s *Set) versionTableDDL(schema string) string {
	ddl := "CREATE SCHEMA IF NOT EXISTS " + ident.Quote(schema) + ";\n" +
		"CREATE TABLE IF NOT EXISTS " + s.table(schema) + " (\n" +
		"    version    integer     PRIMARY KEY,\n" +
		"    name       text        NOT NULL,\n" +
		"    applied_at timestamptz NOT NULL DEFAULT now()\n" +
		");\n"
	if s.Extra != nil {
		ddl += "ALTER TABLE " + s.table(schema) + " ADD COLUMN IF NOT EXISTS " + s.Extra.Name + " integer;\n"
	}
	return ddl
}

// recordSQL records m as applied to schema.
func (s *Set) recordSQL(schema string, m Migration) string {
	cols := "version, name"
	vals := fmt.Sprintf("%d, '%s'", m.Version, strings.ReplaceAll(m.Name, "'", "''"))
	if s.Extra != nil {
		cols += ", " + s.Extra.Name
		vals += fmt.Sprintf(", %d", m.Extra)
	}
	return "INSERT INTO " + s.table(schema) + " (" + cols + ") VALUES (" + vals + ");\n"
}

// Script returns every migration of the set for schema as one plain SQL
// script, with the version bookkeeping: what Apply runs, minus the lock
// and the Before and After steps.
func (s *Set) Script(schema string) (string, error) {
	ms, err := s.Load(schema)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(s.Header(schema))
	b.WriteString("BEGIN;\n")
	b.WriteString(s.versionTableDDL(schema))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %03d_%s\n", m.Version, m.Name)
		b.WriteString(m.SQL)
		b.WriteString(s.recordSQL(schema, m))
	}
	if s.Footer != nil {
		b.WriteString(s.Footer(schema))
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// Beginner is what Apply needs: a *pgxpool.Pool, a *pgx.Conn or a
// *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings schema up to the set's latest version and returns the
// versions it applied (none when already current). It runs in one
// transaction under an advisory lock, so concurrent callers are safe: the
// second waits, then finds nothing to do.
func (s *Set) Apply(ctx context.Context, db Beginner, schema string) ([]int, error) {
	ms, err := s.Load(schema)
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, s.errorf("%w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if s.Before != nil {
		if err := s.Before(ctx, tx, schema); err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", s.LockKey, schema); err != nil {
		return nil, s.errorf("lock: %w", err)
	}
	applied, err := s.applyMissing(ctx, tx, schema, ms)
	if err != nil {
		return nil, err
	}
	if s.After != nil {
		if err := s.After(ctx, tx, schema); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.errorf("commit: %w", err)
	}
	return applied, nil
}

// applyMissing creates the version table if need be, then runs and records
// each of ms that it does not list, in order.
func (s *Set) applyMissing(ctx context.Context, tx pgx.Tx, schema string, ms []Migration) ([]int, error) {
	if _, err := tx.Exec(ctx, s.versionTableDDL(schema)); err != nil {
		return nil, s.errorf("version table: %w", err)
	}
	rows, err := tx.Query(ctx, "SELECT version FROM "+s.table(schema))
	if err != nil {
		return nil, s.errorf("%w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, s.errorf("%w", err)
	}
	done := map[int]bool{}
	for _, v := range vs {
		done[int(v)] = true
	}
	var applied []int
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, s.errorf("%03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, s.recordSQL(schema, m)); err != nil {
			return nil, s.errorf("record %d: %w", m.Version, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// errorf makes an error of Apply's: "<Prefix>: migrate: <format>".
func (s *Set) errorf(format string, args ...any) error {
	return fmt.Errorf(s.Prefix+": migrate: "+format, args...)
}
