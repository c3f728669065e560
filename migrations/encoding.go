package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// ErrServerEncoding is returned (wrapped) by Apply and CheckEncoding, and
// by a relay's Run, for a database whose server_encoding is not UTF8: the
// outbox's text is then bytes with no encoding the relay can rely on.
// Route patterns are matched twice, by SQL LIKE in the claim and by
// package topic in the relay, and the two disagree on what one character
// is ('?' matches one byte of "é" in LIKE under SQL_ASCII, one code point
// in Go), so a topic could be claimed by one route and routed by another;
// and text that is not UTF-8, which a UTF8 database refuses, would reach
// the sinks altered. The command line exits 2 for it.
var ErrServerEncoding = errors.New("outbox: the database's server_encoding must be UTF8")

// CheckEncoding returns an error wrapping ErrServerEncoding, naming the
// setting and how to fix it, when the database db is connected to does
// not store text as UTF-8.
func CheckEncoding(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) error {
	var enc, name string
	if err := db.QueryRow(ctx, "SELECT current_setting('server_encoding'), current_database()").Scan(&enc, &name); err != nil {
		return fmt.Errorf("outbox: read server_encoding: %w", err)
	}
	if enc == "UTF8" {
		return nil
	}
	return fmt.Errorf("%w: database %s has server_encoding %s, and outbox-relay matches topics and routes as UTF-8 text: "+
		"create the database with ENCODING 'UTF8' (createdb --encoding=UTF8 --template=template0, or CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0) and move the outbox there",
		ErrServerEncoding, Ident(name), enc)
}

// ErrSchemaMissing: the outbox's tables are not in the schema a call
// names (the database was never migrated, or the schema name is wrong).
// The relay, the operator commands and the writer wrap it with the
// database's own error; it is outbox.ErrSchemaMissing too, so either
// package's name finds it with errors.Is.
var ErrSchemaMissing = ident.ErrSchemaMissing
