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

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
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
	require.NoError(t, w.Write(ctx, tx,
		outbox.Message{Topic: "sql", Key: "k", Payload: []byte{0, 0xfe}, Headers: map[string]string{"a": "b"}},
		outbox.Message{Topic: "sql", Payload: []byte{}},
	))
	require.NoError(t, tx.Commit())

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "gone", Payload: []byte("x")}))
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
	}
	for _, tc := range cases {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		err = tc.w.Write(ctx, tx, outbox.Message{Topic: "ok", Payload: []byte{}}, tc.m)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "message 1", tc.name)
		require.NoError(t, tx.Rollback(ctx))
	}
	require.ErrorIs(t, w.Write(ctx, 42, outbox.Message{Topic: "t", Payload: []byte{}}), outbox.ErrUnsupportedTx)
	require.NoError(t, w.Write(ctx, 42), "no messages, nothing to do")
	require.Empty(t, readAll(t, pool, schema))
	require.True(t, errors.Is(outbox.Message{Topic: "t"}.Validate(), outbox.ErrNilPayload))
}
