package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestDedupKeyWhilePending(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	first, err := w.Insert(ctx, tx,
		outbox.Message{Topic: "t", Payload: []byte("a"), DedupKey: "order-1-paid"},
		outbox.Message{Topic: "t", Payload: []byte("b")},
		outbox.Message{Topic: "t", Payload: []byte("a again, same batch"), DedupKey: "order-1-paid"},
	)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.False(t, first[0].Duplicate)
	require.False(t, first[1].Duplicate)
	require.True(t, first[2].Duplicate)
	require.Equal(t, first[0].MessageID, first[2].MessageID, "the duplicate reports the pending message's id")

	// The app retries the whole operation: no new message, same id back.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	again, err := w.Insert(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("retry"), DedupKey: "order-1-paid"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[0].MessageID, again[0].MessageID)
	require.Len(t, readAll(t, pool, schema), 2)

	// Delivered (deleted) ⇒ the key is free again.
	_, err = pool.Exec(ctx, "DELETE FROM "+migrations.Ident(schema)+".messages")
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	after, err := w.Insert(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("new"), DedupKey: "order-1-paid"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.False(t, after[0].Duplicate)
	require.NotEqual(t, first[0].MessageID, after[0].MessageID)
}

func TestDedupKeyConcurrentWriters(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	const writers = 8
	var wg sync.WaitGroup
	results := make([]outbox.Written, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tx, err := pool.Begin(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			defer tx.Rollback(ctx)
			res, err := w.Insert(ctx, tx, outbox.Message{Topic: "race", Payload: []byte{byte(i)}, DedupKey: "same"})
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = res[0]
			errs[i] = tx.Commit(ctx)
		}()
	}
	close(start)
	wg.Wait()
	inserted := 0
	for i := range results {
		require.NoError(t, errs[i])
		if !results[i].Duplicate {
			inserted++
		}
	}
	require.Equal(t, 1, inserted, "exactly one racing writer wins")
	rows := readAll(t, pool, schema)
	require.Len(t, rows, 1)
	for i := range results {
		require.Equal(t, results[0].MessageID, results[i].MessageID, "every writer learns the same id")
	}
}

func TestDelayAndIDColumns(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	id := "0190f5a2-6c1e-7a3b-8d4e-1234567890ab"
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := w.Insert(ctx, tx,
		outbox.Message{Topic: "t", Payload: []byte{}, DeliverAt: at, ID: id},
		outbox.Message{Topic: "t", Payload: []byte{}, DeliverAfter: 10 * time.Minute},
		outbox.Message{Topic: "t", Payload: []byte{}, DeliverAt: time.Now().Add(-time.Hour)},
		outbox.Message{Topic: "t", Payload: []byte{}},
	)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, id, res[0].MessageID)

	rows, err := pool.Query(ctx, "SELECT message_id::text, available_at, extract(epoch FROM available_at - created_at)::float8 FROM "+
		migrations.Ident(schema)+".messages ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var got []struct {
		id    string
		at    *time.Time
		delay *float64
	}
	for rows.Next() {
		var r struct {
			id    string
			at    *time.Time
			delay *float64
		}
		require.NoError(t, rows.Scan(&r.id, &r.at, &r.delay))
		got = append(got, r)
	}
	require.Equal(t, id, got[0].id)
	require.True(t, got[0].at.Equal(at))
	require.InDelta(t, 600, *got[1].delay, 1, "DeliverAfter counts from the transaction's database time")
	require.Nil(t, got[2].at, "a time in the past means now")
	require.Nil(t, got[3].at)

	require.ErrorIs(t, insert(t, pool, w, outbox.Message{Topic: "t", Payload: []byte{}, ID: "nope"}), outbox.ErrInvalidID)
	require.ErrorIs(t, insert(t, pool, w, outbox.Message{Topic: "t", Payload: []byte{}, DeliverAfter: -time.Second}), outbox.ErrInvalidDelay)
}

func TestDedupDatabaseSQL(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	ctx := context.Background()
	var ids []string
	for i := 0; i < 2; i++ {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err := w.InsertSQL(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("x"), DedupKey: "k", DeliverAfter: time.Minute})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.Equal(t, i == 1, res[0].Duplicate)
		ids = append(ids, res[0].MessageID)
	}
	require.Equal(t, ids[0], ids[1])
	require.Len(t, readAll(t, pool, schema), 1)
}

func TestEnqueueDelayAndDedupInSQL(t *testing.T) {
	t.Parallel()
	pool, _, schema := setup(t)
	ctx := context.Background()
	s := migrations.Ident(schema)
	var a, b string
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+s+`.enqueue('t', 'k', '{"a":1}'::jsonb, '{}', now() + interval '5 minutes', 'once')::text`).Scan(&a))
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+s+`.enqueue('t', 'k', 'again', dedup_key => 'once')::text`).Scan(&b))
	require.Equal(t, a, b, "a pending dedup key returns the existing message id")
	var n int
	var delayed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), bool_and(available_at > now()) FROM `+s+`.messages`).Scan(&n, &delayed))
	require.Equal(t, 1, n)
	require.True(t, delayed)
}

func TestPriorityColumn(t *testing.T) {
	t.Parallel()
	pool, w, schema := setup(t)
	ctx := context.Background()
	s := migrations.Ident(schema)
	require.NoError(t, insert(t, pool, w,
		outbox.Message{Topic: "t", Payload: []byte{}},
		outbox.Message{Topic: "t", Payload: []byte{}, Priority: 7},
		outbox.Message{Topic: "t", Payload: []byte{}, Priority: outbox.MaxPriority}))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = w.InsertSQL(ctx, tx, outbox.Message{Topic: "t", Payload: []byte{}, Priority: 3})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	_, err = pool.Exec(ctx, `SELECT `+s+`.enqueue('t', 'k', 'sql', priority => 9::smallint)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT `+s+`.enqueue('t', 'k', 'sql', priority => 9)`)
	require.NoError(t, err, "an integer literal works without a cast")

	rows, err := pool.Query(ctx, `SELECT priority FROM `+s+`.messages ORDER BY id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	require.NoError(t, err)
	require.Equal(t, []int16{0, 7, outbox.MaxPriority, 3, 9, 9}, got)

	for _, p := range []int{-1, outbox.MaxPriority + 1} {
		require.ErrorIs(t, insert(t, pool, w, outbox.Message{Topic: "t", Payload: []byte{}, Priority: p}), outbox.ErrInvalidPriority)
	}
	_, err = pool.Exec(ctx, `SELECT `+s+`.enqueue('t', 'k', 'sql', priority => -1)`)
	require.ErrorContains(t, err, "messages_priority_range")
}
