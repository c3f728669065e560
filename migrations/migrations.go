// Package migrations holds the outbox schema as numbered SQL files embedded
// in the binary, and applies them under an advisory lock.
//
// Files are named NNN_name.up.sql. They are templates: {{.Schema}} becomes
// the quoted schema name and {{.Channel}} the NOTIFY channel as a string
// literal, so one set of files serves any schema name, however odd.
// Applied versions are recorded in <schema>.schema_migrations.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/sqlmigrate"
)

//go:embed *.up.sql
var files embed.FS

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = ident.DefaultSchema

// Migration is one rendered migration.
type Migration struct {
	Version int
	Name    string
	SQL     string
	// RelayMin is the lowest schema version a relay must know to run on a
	// schema with this migration applied. A file declares it with a line
	// "-- relay-min: N" when relays built for version N still work after
	// it (it only adds what they do not use); by default it is Version:
	// a relay older than the migration stops (see Requirement).
	RelayMin int
}

var relayMinLine = regexp.MustCompile(`(?m)^-- relay-min: (\d+)`)

// ValidateSchema reports whether name can be used as the outbox schema.
// Any characters are allowed (names are always quoted); the length is
// limited by the NOTIFY channel derived from it.
func ValidateSchema(name string) error { return ident.ValidateSchema(name) }

// Channel is the LISTEN/NOTIFY channel on which inserts into schema's
// outbox are announced.
func Channel(schema string) string { return ident.Channel(schema) }

// Ident quotes schema as an SQL identifier.
func Ident(schema string) string { return ident.Quote(schema) }

// Literal quotes s as an SQL string literal.
func Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Load renders every migration for schema, in version order.
func Load(schema string) ([]Migration, error) {
	ms, err := set.Load(schema)
	if err != nil {
		return nil, err
	}
	out := make([]Migration, len(ms))
	for i, m := range ms {
		out[i] = Migration{Version: m.Version, Name: m.Name, SQL: m.SQL, RelayMin: m.Extra}
	}
	return out, nil
}

// Latest is the highest migration version shipped in this binary.
func Latest() int { return latest() }

// latest renders the migrations once: the relay asks at every heartbeat
// (a schema migrated under it), and rendering every template each time
// was a seventh of an idle relay's CPU.
var latest = sync.OnceValue(func() int {
	ms, err := Load(DefaultSchema)
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
})

// set is the outbox's migrations. The lock key namespaces the migration
// advisory lock (two-int form: this constant and a hash of the schema
// name).
var set = &sqlmigrate.Set{
	Files:    files,
	Glob:     "*.up.sql",
	Validate: ValidateSchema,
	Data: func(schema string) any {
		return struct{ Schema, Channel string }{Ident(schema), Literal(Channel(schema))}
	},
	Table: "schema_migrations",
	// Added with version 8; NULL for migrations recorded before.
	Extra:   &sqlmigrate.Column{Name: "relay_min", Value: relayMin},
	LockKey: 0x6f757462, // "outb"
	Prefix:  "outbox",
	Header: func(schema string) string {
		return "-- outbox-relay schema for " + Ident(schema) + "; apply in one transaction.\n"
	},
	Footer: publicationComment,
	Before: func(ctx context.Context, tx pgx.Tx, _ string) error { return CheckEncoding(ctx, tx) },
	After:  ensurePublication,
}

// relayMin reads m's RelayMin from its "-- relay-min: N" line; without
// one it is m's own version.
func relayMin(m sqlmigrate.Migration) (int, error) {
	sub := relayMinLine.FindStringSubmatch(m.SQL)
	if sub == nil {
		return m.Version, nil
	}
	v, err := strconv.Atoi(sub[1])
	if err != nil || v > m.Version {
		return 0, fmt.Errorf("relay-min must be a version up to %d", m.Version)
	}
	return v, nil
}

// publicationComment ends the script: the publication that Apply creates
// where it can, for the reader to create by hand.
func publicationComment(schema string) string {
	return "\n-- Where wal_level = logical, `outbox-relay migrate` also creates the\n" +
		"-- publication the relays follow to learn of new rows (run --wakeup auto|wal):\n" +
		"-- CREATE PUBLICATION " + Ident(Publication(schema)) + " FOR TABLE " + Ident(schema) + ".messages (id, key) WITH (publish = 'insert');\n" +
		"-- (the column list, PostgreSQL 15+, keeps payloads out of the stream; before 15, leave \"(id)\" out)\n"
}

// Script returns every migration for schema as one plain SQL script, with
// the version bookkeeping, for teams that apply migrations with their own
// tool. It is what Apply runs, minus the lock.
func Script(schema string) (string, error) { return set.Script(schema) }

// Conn is what Apply needs: a *pgx.Conn, a *pgxpool.Pool or a
// *pgxpool.Conn.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings schema up to the latest version and returns the versions it
// applied (none when already current). It runs in one transaction under an
// advisory lock, so concurrent callers are safe: the second waits, then
// finds nothing to do. It refuses a database whose server_encoding is not
// UTF8 (ErrServerEncoding).
func Apply(ctx context.Context, db Conn, schema string) ([]int, error) {
	return set.Apply(ctx, db, schema)
}

// Current returns the highest applied version of schema, 0 when the schema
// has never been migrated.
func Current(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", Ident(schema)+".schema_migrations").Scan(&exists); err != nil {
		return 0, fmt.Errorf("outbox: migration version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+Ident(schema)+".schema_migrations").Scan(&v); err != nil {
		return 0, fmt.Errorf("outbox: migration version: %w", err)
	}
	return v, nil
}

// Requirement returns the highest applied version of schema (0 when the
// schema has never been migrated) and the lowest version a relay must know
// to run on it (the highest RelayMin applied). A relay knowing version
// Latest() may run when version >= Latest() and relayMin <= Latest(). One
// round trip; do not call it inside a transaction (a missing schema is an
// error there).
func Requirement(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string) (version, relayMin int, err error) {
	// Through to_jsonb, so that a version table written before relay_min
	// existed reads too (every migration then needs its own version).
	err = db.QueryRow(ctx, `SELECT coalesce(max(version), 0), coalesce(max(coalesce((to_jsonb(m) ->> 'relay_min')::int, version)), 0)
FROM `+Ident(schema)+`.schema_migrations m`).Scan(&version, &relayMin)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") { // no such table, no such schema
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: migration version: %w", err)
	}
	return version, relayMin, nil
}

// Publication is the name of the logical-replication publication through
// which relays follow inserts into schema's outbox (run --wakeup wal).
// Schema names are at most 54 bytes, so it fits in an identifier.
func Publication(schema string) string { return schema + "_relay" }

// ensurePublication creates schema's publication when the server can
// decode the WAL (wal_level = logical) and it does not exist yet, if the
// migrating role may (it needs CREATE on the database): otherwise it does
// nothing, and relays poll. It runs at every Apply, so a server switched
// to wal_level = logical later gets it at the next migrate. A publication
// that exists but does not publish the outbox's inserts (DROP SCHEMA
// leaves the publication behind, empty, and a schema created again under
// the same name would otherwise be followed through it in vain) gets the
// table and the inserts back.
//
// The stream is only a wake-up: the relays read the id and the key of an
// inserted row (the key gives its lane) and nothing else. Where the
// server has column lists (PostgreSQL 15+), the publication carries those
// two alone, so that payloads (up to the outbox's limit each) are not
// sent to every following relay; an older publication (every column, or
// the id alone as releases up to 0.1 made it) gets this column list at
// the next migrate.
func ensurePublication(ctx context.Context, tx pgx.Tx, schema string) error {
	var logical, exists, covers, inserts, columnLists bool
	err := tx.QueryRow(ctx, `SELECT current_setting('wal_level') = 'logical',
       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
       EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = 'messages'),
       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1 AND pubinsert),
       current_setting('server_version_num')::int >= 150000`,
		Publication(schema), schema).Scan(&logical, &exists, &covers, &inserts, &columnLists)
	if err != nil {
		return fmt.Errorf("outbox: migrate: publication: %w", err)
	}
	listed := !columnLists // nothing to do where there are no column lists
	if columnLists && covers {
		// attnames (15+): the published columns, all of them without a list.
		err := tx.QueryRow(ctx, `SELECT attnames = ARRAY['id', 'key']::name[] FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = 'messages'`,
			Publication(schema), schema).Scan(&listed)
		if err != nil {
			return fmt.Errorf("outbox: migrate: publication: %w", err)
		}
	}
	if !logical || (exists && covers && inserts && listed) {
		return nil
	}
	pub, table := Ident(Publication(schema)), Ident(schema)+".messages"
	if columnLists {
		table += " (id, key)"
	}
	var stmts []string
	switch {
	case !exists:
		stmts = []string{"CREATE PUBLICATION " + pub + " FOR TABLE " + table + " WITH (publish = 'insert')"}
	default:
		if !covers || !listed {
			stmts = append(stmts, "ALTER PUBLICATION "+pub+" SET TABLE "+table)
		}
		if !inserts {
			stmts = append(stmts, "ALTER PUBLICATION "+pub+" SET (publish = 'insert')")
		}
	}
	sp, err := tx.Begin(ctx) // a savepoint: a refusal must not abort the migration
	if err != nil {
		return fmt.Errorf("outbox: migrate: publication: %w", err)
	}
	for _, st := range stmts {
		_, err = sp.Exec(ctx, st)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "42710") { // not allowed; created or added concurrently
			return sp.Rollback(ctx)
		}
		if err != nil {
			return fmt.Errorf("outbox: migrate: %s: %w", st, err)
		}
	}
	return sp.Commit(ctx)
}

// Wake-up modes that SetWakeup knows (relay.Config.Wakeup's values).
var wakeupModes = []string{"auto", "wal", "poll", "notify"}

// SetWakeup makes schema's writers notify the relays at commit (mode
// "notify": the messages_notify trigger enabled) or not (any other mode:
// disabled, the default since version 9). It needs ownership of the
// messages table; `outbox-relay migrate --wakeup` calls it.
func SetWakeup(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, schema, mode string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	known := false
	for _, m := range wakeupModes {
		known = known || m == mode
	}
	if !known {
		return fmt.Errorf("outbox: wakeup: must be one of %s, got %q", strings.Join(wakeupModes, ", "), mode)
	}
	op := "DISABLE"
	if mode == "notify" {
		op = "ENABLE"
	}
	if _, err := db.Exec(ctx, "ALTER TABLE "+Ident(schema)+".messages "+op+" TRIGGER messages_notify"); err != nil {
		return fmt.Errorf("outbox: migrate: wakeup %s: %w", mode, err)
	}
	return nil
}
