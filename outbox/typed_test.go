package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The writer's signatures are the guarantee that a message is written in
// the caller's transaction: a pool, a connection or a *sql.DB does not
// compile where a transaction is required. This test pins the signatures
// and the types they refuse, so that loosening them fails here.
func TestOnlyTransactionsCompile(t *testing.T) {
	t.Parallel()
	txIface := reflect.TypeFor[pgx.Tx]()
	sqlTx := reflect.TypeFor[*sql.Tx]()
	w := &outbox.Writer{}
	for name, f := range map[string]any{
		"Write": outbox.Write, "Insert": outbox.Insert, "Writer.Write": w.Write, "Writer.Insert": w.Insert,
	} {
		require.Equal(t, txIface, reflect.TypeOf(f).In(1), name)
	}
	for name, f := range map[string]any{
		"WriteSQL": outbox.WriteSQL, "InsertSQL": outbox.InsertSQL, "Writer.WriteSQL": w.WriteSQL, "Writer.InsertSQL": w.InsertSQL,
	} {
		require.Equal(t, sqlTx, reflect.TypeOf(f).In(1), name)
	}
	for _, ok := range []reflect.Type{reflect.TypeFor[*pgxpool.Tx]()} {
		require.True(t, ok.Implements(txIface), "%v is a transaction", ok)
	}
	for _, no := range []reflect.Type{reflect.TypeFor[*pgxpool.Pool](), reflect.TypeFor[*pgxpool.Conn](), reflect.TypeFor[*pgx.Conn]()} {
		require.False(t, no.Implements(txIface), "%v must not compile as a pgx.Tx", no)
	}
}

// addHeader is a HeaderInjector that copies the headers and adds one.
type addHeader struct{}

func (addHeader) InjectHeaders(ctx context.Context, h map[string]string) map[string]string {
	out := maps.Clone(h)
	if out == nil {
		out = map[string]string{}
	}
	out["x-from-ctx"], _ = ctx.Value(addHeader{}).(string)
	return out
}

// The pgx and database/sql transports store the same row for the same
// message: every column the writer sets, including the Headers hook's
// additions.
func TestPgxAndSQLWriteIdenticalRows(t *testing.T) {
	t.Parallel()
	pool, _, schema := setup(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, Headers: addHeader{}})
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), addHeader{}, "v")
	at := time.Date(2100, 1, 2, 3, 4, 5, 6000, time.UTC)
	msgs := []outbox.Message{
		{Topic: "t", Payload: []byte{}},
		{Topic: "t.ü", Key: "k", Payload: []byte{0, 1, 0xff}, Headers: map[string]string{"a": "<&>", "é": "\u2028"},
			ID: "0190a6d2-7c3e-7b1a-9c7e-3f1f5e1d2a01", DedupKey: "d", DeliverAt: at, Priority: 3},
		{Topic: "t", Key: "k", Payload: []byte("x"), DeliverAfter: 90 * time.Second, Priority: outbox.MaxPriority},
		{Topic: "t", Payload: []byte("past"), DeliverAt: time.Now().Add(-time.Hour)},
	}
	// Each transport writes in a transaction that is rolled back, and
	// reads the rows back inside it (available_at relative to the
	// transaction's now(), so that both runs compare).
	const cols = `SELECT message_id::text, topic, key, payload, headers::text, dedup_key, available_at, (available_at - now())::text, priority, lane
		FROM %s.messages ORDER BY id`
	type stored struct {
		id, topic      string
		key            *string
		payload        []byte
		headers        string
		dedup          *string
		at             *time.Time
		rel            *string
		priority, lane int16
	}
	query := fmt.Sprintf(cols, migrations.Ident(schema))
	var viaPgx, viaSQL []stored
	{
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, w.Write(ctx, tx, msgs...))
		rows, err := tx.Query(ctx, query)
		require.NoError(t, err)
		viaPgx, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
			var s stored
			err := r.Scan(&s.id, &s.topic, &s.key, &s.payload, &s.headers, &s.dedup, &s.at, &s.rel, &s.priority, &s.lane)
			return s, err
		})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
	}
	{
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // read only
		require.NoError(t, w.WriteSQL(ctx, tx, msgs...))
		rows, err := tx.QueryContext(ctx, query)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var s stored
			require.NoError(t, rows.Scan(&s.id, &s.topic, &s.key, &s.payload, &s.headers, &s.dedup, &s.at, &s.rel, &s.priority, &s.lane))
			viaSQL = append(viaSQL, s)
		}
		require.NoError(t, rows.Err())
	}
	require.Len(t, viaPgx, len(msgs))
	require.Len(t, viaSQL, len(msgs))
	for i := range msgs {
		p, s := viaPgx[i], viaSQL[i]
		if msgs[i].ID == "" {
			p.id, s.id = "", "" // generated
		}
		if msgs[i].Key == "" {
			p.lane, s.lane = 0, 0 // keyless messages spread over the lanes
		}
		if msgs[i].DeliverAfter > 0 {
			p.at, s.at = nil, nil // absolute time differs, rel compares
		} else {
			p.rel, s.rel = nil, nil
		}
		if p.at != nil {
			require.True(t, p.at.Equal(*s.at), "message %d: available_at", i)
			p.at, s.at = nil, nil
		}
		require.Equal(t, p, s, "message %d", i)
		require.Contains(t, p.headers, `"x-from-ctx": "v"`, "message %d: the hook ran", i)
	}
	require.Equal(t, "00:01:30", *viaPgx[2].rel)
	require.True(t, viaPgx[1].at.Equal(at))
	require.Nil(t, viaPgx[3].at, "a past DeliverAt means now")
}
