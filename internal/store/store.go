// Package store owns every SQL statement that outbox-relay runs on its own
// tables: the relay's claim, settlement and leases, the operator actions on
// dead letters and the archive, the status and metrics counts. Nothing else
// in the module writes SQL against those tables.
//
// The only thing ever spliced into a statement's text is the schema name,
// quoted as an identifier (the archive's DDL, which takes no arguments,
// also names its partitions and their bounds); values go in as named
// arguments (@name, pgx.NamedArgs), never by position. The relay's
// statements, which run for every batch, are rendered once per schema and
// source and turned into pgx's positional form then (stmt.go); the
// operator's, which run on demand, are built at each call. Each statement
// has a typed method or argument struct that builds its arguments, so a
// caller cannot pass a value in the wrong place. The rendered text of
// every statement is kept under testdata/ and compared by the golden
// tests: a change to a statement shows up in review as a diff of SQL.
//
// The states a message can be in are defined once, in states.go, and every
// count and condition on them is built from those definitions.
package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Schema is a validated schema name and its quoted form, from which the
// statements are rendered.
type Schema struct {
	name   string
	quoted string
}

// NewSchema validates name (empty means the default schema).
func NewSchema(name string) (Schema, error) {
	if name == "" {
		name = ident.DefaultSchema
	}
	if err := ident.ValidateSchema(name); err != nil {
		return Schema{}, err
	}
	return Schema{name: name, quoted: ident.Quote(name)}, nil
}

// Name is the schema's name, unquoted.
func (s Schema) Name() string { return s.name }

// Table is the quoted, schema-qualified name of one of the relay's tables.
func (s Schema) Table(name string) string { return s.quoted + "." + pgx.Identifier{name}.Sanitize() }
