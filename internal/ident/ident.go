// Package ident names the outbox schema: its default, the check on a
// configured name, its quoting as an SQL identifier, and the error of a
// schema that holds no outbox tables. It is shared by the writer (package
// outbox), package migrations and the relay, so that the writer does not
// import the embedded migration files and the relay does not import the
// writer; it holds nothing else.
package ident

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = "outbox"

// maxSchemaLen keeps Channel(schema) within Postgres' 63-byte identifier
// limit.
const maxSchemaLen = 54

// ValidateSchema reports whether name can be used as the outbox schema.
// Any characters are allowed (names are always quoted); the length is
// limited by the NOTIFY channel derived from it.
func ValidateSchema(name string) error {
	switch {
	case name == "":
		return errors.New("outbox: schema: must not be empty")
	case len(name) > maxSchemaLen:
		return fmt.Errorf("outbox: schema: %d bytes is longer than the %d allowed", len(name), maxSchemaLen)
	case strings.ContainsRune(name, 0):
		return errors.New("outbox: schema: must not contain NUL")
	}
	return nil
}

// Channel is the LISTEN/NOTIFY channel on which inserts into schema's
// outbox are announced.
func Channel(schema string) string { return schema + ".messages" }

// Quote quotes name as an SQL identifier.
func Quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// ErrSchemaMissing: the outbox's tables are not in the schema a call
// names (the database was never migrated, or the schema name is wrong).
// outbox.ErrSchemaMissing and migrations.ErrSchemaMissing are this error.
var ErrSchemaMissing = errors.New("outbox: schema not migrated")

// SchemaMissing returns err wrapped with ErrSchemaMissing and what to do
// when err is the database saying that the schema or one of its tables
// does not exist (SQLSTATE 3F000 or 42P01), and err itself otherwise. It
// reads the SQLSTATE through the SQLState method that both pgx and
// lib/pq errors have.
func SchemaMissing(err error, schema string) error {
	var se interface{ SQLState() string }
	if err == nil || !errors.As(err, &se) {
		return err
	}
	if c := se.SQLState(); c != "3F000" && c != "42P01" {
		return err
	}
	return fmt.Errorf("%w: schema %s has no outbox tables; run `outbox-relay migrate` (or apply `outbox-relay migrate --print`), or check the schema name (%w)",
		ErrSchemaMissing, Quote(schema), err)
}
