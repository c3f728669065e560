// Package ident names the outbox schema: its default, the check on a
// configured name, and its quoting as an SQL identifier. It is shared by
// the writer (package outbox) and package migrations so that the writer
// does not import the embedded migration files; it holds nothing else.
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
