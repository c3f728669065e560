package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// FuzzHeadersRoundTrip: whatever headers and key an application passes,
// Message.Validate either rejects them with ErrInvalidHeader/ErrInvalidKey,
// or the writer stores them (through pgx and through database/sql) and
// they come back from the jsonb column exactly as written, the way the
// relay reads them. Each case runs in a transaction that is rolled back.
func FuzzHeadersRoundTrip(f *testing.F) {
	pool, schema := pgtest.Schema(f)
	db, err := sql.Open("pgx", pgtest.URL())
	require.NoError(f, err)
	f.Cleanup(func() { _ = db.Close() })
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(f, err)
	table := migrations.Ident(schema) + ".messages"

	for _, s := range [][4]string{
		{"type", "OrderPlaced", "trace", "00-abc-01"},
		{"content-type", "application/json; charset=utf-8", "x", ""},
		{"é", "ü-✓ \u2028 \u2029", "emoji", "🙂"},
		{"nul", "a\x00b", "k", "v"},
		{"bad", "\xff", "k", "v"},
		{"", "empty name", "k", "v"},
		{"quote\"", "back\\slash", "<html>", "&amp;"},
		{"esc", `\u0000`, "ctl", "\r\n\t\x01\x1f\x7f"},
		{"dup", "1", "dup", "2"},
		{"\ufffe", "\U0010ffff", "surrogate-like", "\xed\xa0\x80"},
	} {
		f.Add(s[0], s[1], s[2], s[3], false)
		f.Add(s[0], s[1], s[2], s[3], true)
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, viaSQL bool) {
		h := map[string]string{k1: v1, k2: v2}
		m := outbox.Message{Topic: "fuzz", Key: v1, Payload: []byte("x"), Headers: h}
		if err := m.Validate(); err != nil {
			if !errors.Is(err, outbox.ErrInvalidHeader) && !errors.Is(err, outbox.ErrInvalidKey) {
				t.Fatalf("Validate: unexpected error %v", err)
			}
			return
		}
		ctx := context.Background()
		var gotHeaders map[string]string
		var gotKey *string
		if viaSQL {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback() //nolint:errcheck // the case never commits
			ws, err := w.InsertSQL(ctx, tx, m)
			require.NoError(t, err, "valid headers %q must be accepted by Postgres", h)
			var raw string
			var key sql.NullString
			require.NoError(t, tx.QueryRowContext(ctx, "SELECT headers::text, key FROM "+table+" WHERE message_id = $1", ws[0].MessageID).Scan(&raw, &key))
			require.NoError(t, json.Unmarshal([]byte(raw), &gotHeaders))
			if key.Valid {
				gotKey = &key.String
			}
		} else {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // the case never commits
			ws, err := w.Insert(ctx, tx, m)
			require.NoError(t, err, "valid headers %q must be accepted by Postgres", h)
			// Scanned the way the relay scans its claim.
			require.NoError(t, tx.QueryRow(ctx, "SELECT headers, key FROM "+table+" WHERE message_id = $1", ws[0].MessageID).Scan(&gotHeaders, &gotKey))
		}
		if !reflect.DeepEqual(h, gotHeaders) {
			t.Fatalf("headers changed in the database: wrote %q, read %q", h, gotHeaders)
		}
		switch {
		case v1 == "" && gotKey != nil:
			t.Fatalf("empty key stored as %q, want NULL", *gotKey)
		case v1 != "" && (gotKey == nil || *gotKey != v1):
			t.Fatalf("key changed in the database: wrote %q, read %v", v1, gotKey)
		}
	})
}
