package inbox

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.up.sql
var files embed.FS

// Migration is one rendered migration of the inbox tables.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations renders the inbox migrations for schema, in version order.
func Migrations(schema string) ([]Migration, error) {
	if err := validSchema(schema); err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "migrations/*.up.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	data := struct{ Schema string }{quote(schema)}
	var out []Migration
	for _, path := range names {
		name := strings.TrimPrefix(path, "migrations/")
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("outbox: inbox: migration file %q: name must start with a number", name)
		}
		raw, err := files.ReadFile(path)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("outbox: inbox: migration %s: %w", name, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("outbox: inbox: migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(rest, ".up.sql"), SQL: buf.String()})
	}
	return out, nil
}

// The version table is named apart from the outbox's own
// (schema_migrations), so that the inbox may share the outbox's schema.
func versionTableDDL(schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + quote(schema) + ";\n" +
		"CREATE TABLE IF NOT EXISTS " + quote(schema) + ".inbox_migrations (\n" +
		"    version    integer     PRIMARY KEY,\n" +
		"    name       text        NOT NULL,\n" +
		"    applied_at timestamptz NOT NULL DEFAULT now()\n" +
		");\n"
}

func recordSQL(schema string, m Migration) string {
	return fmt.Sprintf("INSERT INTO %s.inbox_migrations (version, name) VALUES (%d, '%s');\n",
		quote(schema), m.Version, strings.ReplaceAll(m.Name, "'", "''"))
}

// Script returns the inbox migrations for schema as one plain SQL script,
// with the version bookkeeping, for teams that apply migrations with their
// own tool (Flyway, goose, Atlas). It is what Migrate runs, minus the lock.
func Script(schema string) (string, error) {
	ms, err := Migrations(schema)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- outbox-relay inbox tables for " + quote(schema) + "; apply in one transaction.\n")
	b.WriteString("BEGIN;\n")
	b.WriteString(versionTableDDL(schema))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %03d_%s\n", m.Version, m.Name)
		b.WriteString(m.SQL)
		b.WriteString(recordSQL(schema, m))
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// Beginner is what Migrate and Run need: a *pgxpool.Pool, a *pgx.Conn or
// a *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// lockKey namespaces the migration advisory lock (two-int form: this
// constant and a hash of the schema name), apart from the outbox's.
const lockKey = 0x696e6278 // "inbx"

// Migrate brings the inbox tables in schema up to the latest version and
// returns the versions it applied (none when already current). It runs in
// one transaction under an advisory lock, so consumers that all migrate at
// start-up are safe: the second waits, then finds nothing to do.
func Migrate(ctx context.Context, db Beginner, schema string) ([]int, error) {
	ms, err := Migrations(schema)
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", lockKey, schema); err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, versionTableDDL(schema)); err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: version table: %w", err)
	}
	rows, err := tx.Query(ctx, "SELECT version FROM "+quote(schema)+".inbox_migrations")
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: %w", err)
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
			return nil, fmt.Errorf("outbox: inbox: migrate: %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, recordSQL(schema, m)); err != nil {
			return nil, fmt.Errorf("outbox: inbox: migrate: record %d: %w", m.Version, err)
		}
		applied = append(applied, m.Version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: inbox: migrate: commit: %w", err)
	}
	return applied, nil
}
