package inbox

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/sqlmigrate"
)

//go:embed migrations/*.up.sql
var files embed.FS

// Migration is one rendered migration of the inbox tables.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// set is the inbox's migrations. Its version table is named apart from
// the outbox's own (schema_migrations), and its lock key apart from the
// outbox's, so that the inbox may share the outbox's schema.
var set = &sqlmigrate.Set{
	Files:    files,
	Glob:     "migrations/*.up.sql",
	Validate: validSchema,
	Data:     func(schema string) any { return struct{ Schema string }{quote(schema)} },
	Table:    "inbox_migrations",
	LockKey:  0x696e6278, // "inbx"
	Prefix:   "outbox: inbox",
	Header: func(schema string) string {
		return "-- outbox-relay inbox tables for " + quote(schema) + "; apply in one transaction.\n"
	},
}

// Migrations renders the inbox migrations for schema, in version order.
func Migrations(schema string) ([]Migration, error) {
	ms, err := set.Load(schema)
	if err != nil {
		return nil, err
	}
	out := make([]Migration, len(ms))
	for i, m := range ms {
		out[i] = Migration{Version: m.Version, Name: m.Name, SQL: m.SQL}
	}
	return out, nil
}

// Script returns the inbox migrations for schema as one plain SQL script,
// with the version bookkeeping, for teams that apply migrations with their
// own tool (Flyway, goose, Atlas). It is what Migrate runs, minus the lock.
func Script(schema string) (string, error) { return set.Script(schema) }

// Beginner is what Migrate and Run need: a *pgxpool.Pool, a *pgx.Conn or
// a *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate brings the inbox tables in schema up to the latest version and
// returns the versions it applied (none when already current). It runs in
// one transaction under an advisory lock, so consumers that all migrate at
// start-up are safe: the second waits, then finds nothing to do.
func Migrate(ctx context.Context, db Beginner, schema string) ([]int, error) {
	return set.Apply(ctx, db, schema)
}
