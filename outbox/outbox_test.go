package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

type row struct {
	topic   string
	key     *string
	payload []byte
	headers map[string]string
	lane    int16
}

func setup(t *testing.T) (*pgxpool.Pool, *outbox.Writer, string) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	return pool, w, schema
}

// insert writes msgs with w in a transaction of its own, committed
// unless the write fails.
func insert(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, msgs ...outbox.Message) error {
	t.Helper()
	ctx := context.Background()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) })
}

func readAll(t *testing.T, pool *pgxpool.Pool, schema string) []row {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT topic, key, payload, headers, lane FROM "+migrations.Ident(schema)+".messages ORDER BY id")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.topic, &x.key, &x.payload, &x.headers, &x.lane)
		return x, err
	})
	require.NoError(t, err)
	return out
}

func TestWritePgxCommitAndRollback(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx,
		outbox.Message{Topic: "a", Key: "k1", Payload: []byte{0, 1, 2, 0xff}, Headers: map[string]string{"x": "ü"}},
		outbox.Message{Topic: "b", Payload: []byte{}},
	))
	require.NoError(t, tx.Commit(ctx))

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "rolled-back", Payload: []byte("x")}))
	require.NoError(t, tx.Rollback(ctx))

	got := readAll(t, pool, schema)
	require.Len(t, got, 2)
	require.Equal(t, "a", got[0].topic)
	require.Equal(t, "k1", *got[0].key)
	require.Equal(t, []byte{0, 1, 2, 0xff}, got[0].payload)
	require.Equal(t, map[string]string{"x": "ü"}, got[0].headers)
	require.Nil(t, got[1].key, "empty key is stored as NULL")
	require.Empty(t, got[1].payload)
}

func TestWriteManyInOneStatement(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	msgs := make([]outbox.Message, 5000)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%10), Payload: []byte(fmt.Sprint(i))}
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))
	got := readAll(t, pool, schema)
	require.Len(t, got, len(msgs))
	for i, r := range got {
		require.Equal(t, fmt.Sprint(i), string(r.payload), "insertion order is id order")
	}
	// Same key, same lane.
	lanes := map[string]int16{}
	for _, r := range got {
		if l, ok := lanes[*r.key]; ok {
			require.Equal(t, l, r.lane)
		}
		lanes[*r.key] = r.lane
	}
}

func TestWriteDatabaseSQL(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	ctx := context.Background()

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteSQL(ctx, tx,
		outbox.Message{Topic: "sql", Key: "k", Payload: []byte{0, 0xfe}, Headers: map[string]string{"a": "b"}},
		outbox.Message{Topic: "sql", Payload: []byte{}},
	))
	require.NoError(t, tx.Commit())

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteSQL(ctx, tx, outbox.Message{Topic: "gone", Payload: []byte("x")}))
	require.NoError(t, tx.Rollback())

	got := readAll(t, pool, schema)
	require.Len(t, got, 2)
	require.Equal(t, []byte{0, 0xfe}, got[0].payload)
	require.Equal(t, map[string]string{"a": "b"}, got[0].headers)
	require.Equal(t, "k", *got[0].key)
	require.Nil(t, got[1].key)
	var _ *sql.Tx = tx
}

func TestWriteValidation(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	small, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, MaxPayloadBytes: 10})
	require.NoError(t, err)
	cases := []struct {
		name string
		w    *outbox.Writer
		m    outbox.Message
		want error
	}{
		{"empty topic", w, outbox.Message{Payload: []byte("x")}, outbox.ErrEmptyTopic},
		{"long topic", w, outbox.Message{Topic: strings.Repeat("t", 250), Payload: []byte("x")}, outbox.ErrInvalidTopic},
		{"control char topic", w, outbox.Message{Topic: "a\nb", Payload: []byte("x")}, outbox.ErrInvalidTopic},
		{"nil payload", w, outbox.Message{Topic: "t"}, outbox.ErrNilPayload},
		{"payload too large", small, outbox.Message{Topic: "t", Payload: make([]byte, 11)}, outbox.ErrPayloadTooLarge},
		{"empty header name", w, outbox.Message{Topic: "t", Payload: []byte{}, Headers: map[string]string{"": "v"}}, outbox.ErrInvalidHeader},
		{"invalid utf8 header", w, outbox.Message{Topic: "t", Payload: []byte{}, Headers: map[string]string{"h": "\xff"}}, outbox.ErrInvalidHeader},
		{"invalid utf8 key", w, outbox.Message{Topic: "t", Key: "\xff", Payload: []byte{}}, outbox.ErrInvalidKey},
		{"long key", w, outbox.Message{Topic: "t", Key: strings.Repeat("k", outbox.MaxKeyLen+1), Payload: []byte{}}, outbox.ErrInvalidKey},
		{"long dedup key", w, outbox.Message{Topic: "t", DedupKey: strings.Repeat("k", outbox.MaxKeyLen+1), Payload: []byte{}}, outbox.ErrInvalidKey},
	}
	for _, tc := range cases {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		err = tc.w.Write(ctx, tx, outbox.Message{Topic: "ok", Payload: []byte{}}, tc.m)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "message 1", tc.name)
		require.NoError(t, tx.Rollback(ctx))
	}
	require.NoError(t, w.Write(ctx, nil), "no messages, nothing to do")
	require.NoError(t, w.WriteSQL(ctx, nil), "no messages, nothing to do")
	require.Empty(t, readAll(t, pool, schema))
	require.True(t, errors.Is(outbox.Message{Topic: "t"}.Validate(), outbox.ErrNilPayload))
}

// Keys and topics longer than the relay can store in its index entries
// are refused when written, by the writer and by the table itself (for
// plain-SQL writers), with an error that names the limit.
func TestKeyAndTopicLimits(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	err := insert(t, pool, w, outbox.Message{Topic: "t", Key: strings.Repeat("k", 4000), Payload: []byte{}})
	require.ErrorIs(t, err, outbox.ErrInvalidKey)
	require.ErrorContains(t, err, "4000 bytes, at most 1024")

	s := migrations.Ident(schema)
	for _, tc := range []struct{ sql, constraint string }{
		{"SELECT " + s + ".enqueue(repeat('t', 250), 'k', 'x')", "messages_topic_length"},
		{"SELECT " + s + ".enqueue('t', repeat('k', 1025), 'x')", "messages_key_length"},
		{"SELECT " + s + ".enqueue('t', 'k', 'x', dedup_key => repeat('d', 1025))", "messages_dedup_key_length"},
		{"INSERT INTO " + s + ".messages (topic, key, payload) VALUES ('t', repeat('k', 4000), '')", "messages_key_length"},
	} {
		_, err := pool.Exec(ctx, tc.sql)
		require.ErrorContains(t, err, tc.constraint, tc.sql)
	}
	// At the limit is fine, in bytes: 256 three-byte runes are 768 bytes.
	_, err = pool.Exec(ctx, "SELECT "+s+".enqueue(repeat('t', 249), repeat('€', 341), 'x', dedup_key => repeat('d', 1024))")
	require.NoError(t, err)
	require.NoError(t, insert(t, pool, w, outbox.Message{Topic: strings.Repeat("t", 249), Key: strings.Repeat("k", 1024), Payload: []byte{}}))
}

// A message id is what consumers deduplicate on, so two pending messages
// never share one: a repeat within one call or of a pending message is
// refused (ErrDuplicateID), and Insert never reports a message it did not
// write as written.
func TestMessageIDsAreUniqueAmongPending(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	const id = "0190a6d2-7c3e-7b1a-9c7e-3f1f5e1d2a01"
	m := outbox.Message{Topic: "t", Payload: []byte("a"), ID: id}

	err := insert(t, pool, w, m, outbox.Message{Topic: "t", Payload: []byte("b"), ID: strings.ToUpper(id)})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)
	require.ErrorContains(t, err, "message 1")
	require.Empty(t, readAll(t, pool, schema))

	require.NoError(t, insert(t, pool, w, m))
	other := outbox.Message{Topic: "t", Payload: []byte("other event"), ID: id}
	require.ErrorIs(t, insert(t, pool, w, other), outbox.ErrDuplicateID, "pgx")
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.ErrorIs(t, w.WriteSQL(ctx, stx, other), outbox.ErrDuplicateID, "database/sql")
	require.NoError(t, stx.Rollback())
	_, err = pool.Exec(ctx, "INSERT INTO "+migrations.Ident(schema)+".messages (message_id, topic, payload) VALUES ($1, 't', 'x')", id)
	require.ErrorContains(t, err, "messages_message_id_idx", "plain SQL writers are held to it too")
	require.Len(t, readAll(t, pool, schema), 1)

	// The same id with the same pending dedup key is the idempotent case:
	// reported as a duplicate, not refused.
	d := outbox.Message{Topic: "t", Payload: []byte("p"), ID: "0190a6d2-7c3e-7b1a-9c7e-3f1f5e1d2a02", DedupKey: "pay:1"}
	require.NoError(t, insert(t, pool, w, d))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to undo
	res, err := w.Insert(ctx, tx, d)
	require.NoError(t, err)
	require.True(t, res[0].Duplicate)
	require.Equal(t, d.ID, res[0].MessageID)
}

// Writing before the schema is migrated says what to do, for both writer
// paths, with the database's error kept.
func TestWriteBeforeMigrate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: pgtest.SchemaName(t)})
	require.NoError(t, err)
	msg := outbox.Message{Topic: "orders", Payload: []byte("{}")}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	err = w.Write(ctx, tx, msg)
	require.ErrorIs(t, err, outbox.ErrSchemaMissing)
	require.ErrorContains(t, err, "run `outbox-relay migrate`")
	require.ErrorContains(t, err, "SQLSTATE 42P01")

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer stx.Rollback()
	err = w.WriteSQL(ctx, stx, msg)
	require.ErrorIs(t, err, outbox.ErrSchemaMissing)

	// Any other database error is returned as it was.
	require.NoError(t, outbox.SchemaMissing(nil, "x"))
	other := errors.New("boom")
	require.Same(t, other, outbox.SchemaMissing(other, "x"))
}
