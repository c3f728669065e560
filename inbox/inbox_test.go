package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
)

// env is one test's inbox in a fresh schema, with an effects table the
// handlers write to.
type env struct {
	pool   *pgxpool.Pool
	schema string
	in     *inbox.Inbox
}

func setup(t *testing.T, cfg inbox.Config) *env {
	t.Helper()
	pool, schema := inboxtest.Schema(t)
	cfg.Schema = schema
	in, err := inbox.New(cfg)
	require.NoError(t, err)
	return &env{pool: pool, schema: schema, in: in}
}

// apply is a handler whose effect is one row in effects.
func (e *env) apply(m inbox.Message) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		return inboxtest.Effect(ctx, tx, e.schema, m)
	}
}

func (e *env) effects(t *testing.T) []inboxtest.Applied {
	t.Helper()
	return inboxtest.Effects(t, e.pool, e.schema)
}

func msg(key string, seq int64) inbox.Message {
	return inbox.Message{ID: uuid.NewString(), Key: key, Seq: seq}
}

func TestDuplicatesSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	m := msg("k", 10)
	for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate, inbox.Duplicate} {
		o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		require.Equal(t, want, o, "delivery %d", i+1)
	}
	// Unkeyed and position-less messages are deduplicated too.
	for _, m := range []inbox.Message{{ID: uuid.NewString()}, {ID: uuid.NewString(), Key: "k2"}} {
		o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, o)
		o, err = e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, o)
	}
	require.Len(t, e.effects(t), 3)
}

// The report's case: a message redelivered after later messages of its
// key is a duplicate, never applied again.
func TestStaleRedeliveryAfterLaterMessagesSkipped(t *testing.T) {
	t.Parallel()
	h := &counting{}
	e := setup(t, inbox.Config{Hooks: h})
	ctx := t.Context()
	ms := []inbox.Message{msg("acct", 3), msg("acct", 7), msg("acct", 9)}
	for _, m := range ms {
		_, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
	}
	for _, m := range []inbox.Message{ms[0], ms[1]} {
		o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, o)
	}
	got := e.effects(t)
	require.Equal(t, []int64{3, 7, 9}, seqs(got))
	require.EqualValues(t, 2, h.dups.Load())
	require.Zero(t, h.ooo.Load())
}

func TestHandlerErrorRollsBackEffectAndRecord(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	m := msg("k", 5)
	boom := errors.New("boom")
	_, err := e.in.Run(ctx, e.pool, m, func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, e.apply(m)(ctx, tx))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, e.effects(t), "the effect rolled back")
	// The record rolled back too: the redelivery is processed, and the
	// key's mark did not move (a later message is not out of order).
	o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, o)
	require.Len(t, e.effects(t), 1)
}

// A message below its key's mark that was never processed is reported,
// not dropped: the consumer sees an *OutOfOrderError with the key, the
// position and the mark, nothing is recorded, and the message is applied
// once the policy allows it.
func TestOutOfOrderNeverSilentlyDropped(t *testing.T) {
	t.Parallel()
	h := &counting{}
	e := setup(t, inbox.Config{Hooks: h})
	ctx := t.Context()
	later, early := msg("acct", 20), msg("acct", 10)
	_, err := e.in.Run(ctx, e.pool, later, e.apply(later))
	require.NoError(t, err)
	for range 2 { // a redelivery stays out of order
		_, err = e.in.Run(ctx, e.pool, early, e.apply(early))
		var ooo *inbox.OutOfOrderError
		require.ErrorAs(t, err, &ooo)
		require.ErrorIs(t, err, inbox.ErrOutOfOrder)
		require.Equal(t, inbox.OutOfOrderError{ID: early.ID, Key: "acct", Seq: 10, Mark: 20}, *ooo)
		require.Contains(t, err.Error(), `key "acct" at position 10`)
	}
	require.Equal(t, []int64{20}, seqs(e.effects(t)))
	require.EqualValues(t, 2, h.ooo.Load())

	// The same position with another id (a reset sequence) is out of
	// order too.
	_, err = e.in.Run(ctx, e.pool, msg("acct", 20), e.apply(early))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder)

	apply, err := inbox.New(inbox.Config{Schema: e.schema, OutOfOrder: inbox.ApplyOutOfOrder, Hooks: h})
	require.NoError(t, err)
	o, err := apply.Run(ctx, e.pool, early, e.apply(early))
	require.NoError(t, err)
	require.Equal(t, inbox.AppliedOutOfOrder, o)
	o, err = apply.Run(ctx, e.pool, early, e.apply(early))
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, o)
	require.Equal(t, []int64{20, 10}, seqs(e.effects(t)))
	// The mark did not go back: 15 is still out of order.
	_, err = e.in.Run(ctx, e.pool, msg("acct", 15), e.apply(early))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder)
}

func TestGapReportedWhenContiguous(t *testing.T) {
	t.Parallel()
	h := &counting{}
	e := setup(t, inbox.Config{Contiguous: true, Hooks: h})
	ctx := t.Context()
	for _, s := range []int64{1, 2, 4} {
		m := msg("k", s)
		_, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, h.gaps.Load())
	require.Equal(t, "k@4>2", h.lastGap.Load())
}

func TestBatch(t *testing.T) {
	t.Parallel()
	h := &counting{}
	e := setup(t, inbox.Config{Hooks: h})
	ctx := t.Context()
	a1, a2, b1, done := msg("a", 1), msg("a", 5), msg("b", 2), msg("a", 3)
	_, err := e.in.Run(ctx, e.pool, done, e.apply(done))
	require.NoError(t, err)
	// done (a@3) processed before; a1 (a@1) then is below the mark.
	batch := []inbox.Message{a2, b1, a2, done, {ID: uuid.NewString()}}
	out, err := e.in.RunBatch(ctx, e.pool, batch, func(ctx context.Context, tx pgx.Tx, i int) error {
		return inboxtest.Effect(ctx, tx, e.schema, batch[i])
	})
	require.NoError(t, err)
	require.Equal(t, []inbox.Outcome{inbox.Processed, inbox.Processed, inbox.Duplicate, inbox.Duplicate, inbox.Processed}, out)
	require.Equal(t, []int64{3, 5, 2, 0}, seqs(e.effects(t)))

	// Out of order against the mark, and inside the batch: the batch fails
	// as a whole and records nothing.
	for _, bad := range [][]inbox.Message{{msg("c", 1), a1}, {msg("d", 9), msg("d", 8)}} {
		_, err = e.in.RunBatch(ctx, e.pool, bad, func(ctx context.Context, tx pgx.Tx, i int) error {
			return inboxtest.Effect(ctx, tx, e.schema, bad[i])
		})
		require.ErrorIs(t, err, inbox.ErrOutOfOrder)
	}
	require.Len(t, e.effects(t), 4)
	o, err := e.in.Run(ctx, e.pool, msg("d", 8), e.apply(msg("d", 8)))
	require.NoError(t, err, "the failed batch left no mark on d")
	require.Equal(t, inbox.Processed, o)
}

// Consumers racing on the same messages (a rebalance, two consumers of
// one queue) apply each message once, and a key's effects in order.
func TestConcurrentConsumersApplyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	const keys, perKey, consumers = 8, 25, 4
	var ms []inbox.Message
	for s := range perKey {
		for k := range keys {
			ms = append(ms, msg(fmt.Sprintf("k%d", k), int64(s*keys+k+1)))
		}
	}
	var outOfOrder atomic.Int64
	var wg sync.WaitGroup
	for c := range consumers {
		wg.Go(func() {
			// Every consumer sees every message, in order, some as
			// batches; the others deliver the same ones at the same time.
			for i := 0; i < len(ms); {
				n := 1 + (i+c)%3
				part := ms[i:min(i+n, len(ms))]
				i += n
				for {
					_, err := e.in.RunBatch(ctx, e.pool, part, func(ctx context.Context, tx pgx.Tx, j int) error {
						return inboxtest.Effect(ctx, tx, e.schema, part[j])
					})
					if err == nil {
						break
					}
					if errors.Is(err, inbox.ErrOutOfOrder) {
						outOfOrder.Add(1)
					}
					if !retriable(err) {
						t.Errorf("consumer %d: %v", c, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	got := e.effects(t)
	require.Len(t, got, len(ms), "each message applied once")
	last := map[string]int64{}
	for _, a := range got {
		require.Greater(t, a.Seq, last[a.Key], "key %s applied out of order", a.Key)
		last[a.Key] = a.Seq
	}
	require.Zero(t, outOfOrder.Load(), "every consumer delivers in order, so nothing is out of order")
}

// retriable: a deadlock or serialization failure between consumers; the
// broker would redeliver.
func retriable(err error) bool {
	s := err.Error()
	return strings.Contains(s, "40P01") || strings.Contains(s, "40001")
}

func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	db := stdlib.OpenDBFromPool(e.pool)
	t.Cleanup(func() { _ = db.Close() })
	m := msg("k", 4)
	fn := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+pgx.Identifier{e.schema, "effects"}.Sanitize()+" (message_id, key, seq) VALUES ($1, $2, $3)", m.ID, m.Key, m.Seq)
		return err
	}
	for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
		o, err := e.in.RunSQL(ctx, db, m, fn)
		require.NoError(t, err)
		require.Equal(t, want, o)
	}
	_, err := e.in.RunSQL(ctx, db, msg("k", 2), fn)
	require.ErrorIs(t, err, inbox.ErrOutOfOrder)
	require.Len(t, e.effects(t), 1)
}

func TestPrune(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	old := []inbox.Message{msg("k", 1), msg("k", 2), msg("", 0), msg("", 0), msg("", 0)}
	for _, m := range old {
		_, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
	}
	_, err := e.pool.Exec(ctx, "UPDATE "+pgx.Identifier{e.schema, "inbox_messages"}.Sanitize()+" SET processed_at = now() - interval '2 days'")
	require.NoError(t, err)
	fresh := msg("k", 3)
	_, err = e.in.Run(ctx, e.pool, fresh, e.apply(fresh))
	require.NoError(t, err)

	_, err = e.in.Prune(ctx, e.pool, inbox.PruneConfig{})
	require.ErrorContains(t, err, "Window")
	n, err := e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, inbox.Pruned{Messages: int64(len(old))}, n, "no KeyWindow: the marks are kept")

	// What a redelivery after the window means: the fresh id is still a
	// duplicate; a pruned keyed one is reported out of order (not applied
	// twice); a pruned unkeyed one is processed again.
	o, err := e.in.Run(ctx, e.pool, fresh, e.apply(fresh))
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, o)
	_, err = e.in.Run(ctx, e.pool, old[0], e.apply(old[0]))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder)
	o, err = e.in.Run(ctx, e.pool, old[2], e.apply(old[2]))
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, o)
}

func TestMigrateAndScript(t *testing.T) {
	t.Parallel()
	pool := inboxtest.Pool(t)
	ctx := t.Context()
	schema := `Odd "schema"; name`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	var wg sync.WaitGroup
	applied := make([][]int, 3)
	for i := range applied {
		wg.Go(func() {
			v, err := inbox.Migrate(ctx, pool, schema)
			require.NoError(t, err)
			applied[i] = v
		})
	}
	wg.Wait()
	var appliers int
	for _, v := range applied {
		if len(v) > 0 {
			appliers++
			require.Equal(t, []int{1, 2, 3}, v)
		}
	}
	require.Equal(t, 1, appliers, "one caller applies the migrations, the others find them done: %v", applied)

	script, err := inbox.Script("consumer")
	require.NoError(t, err)
	require.Contains(t, script, `CREATE TABLE "consumer".inbox_messages`)
	require.Contains(t, script, `INSERT INTO "consumer".inbox_migrations (version, name) VALUES (1, 'init')`)
	// The printed script applies as it is.
	other := "inbox_script_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	script, err = inbox.Script(other)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+other+" CASCADE") })
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Conn().PgConn().Exec(ctx, script).ReadAll()
	require.NoError(t, err)
	v, err := inbox.Migrate(ctx, pool, other)
	require.NoError(t, err)
	require.Empty(t, v)

	_, err = inbox.New(inbox.Config{Schema: strings.Repeat("s", 64)})
	require.ErrorContains(t, err, "Schema")
	_, err = inbox.New(inbox.Config{OutOfOrder: 7})
	require.ErrorContains(t, err, "OutOfOrder")
}

type counting struct {
	dups, ooo, gaps atomic.Int64
	lastGap         atomic.Value
}

func (c *counting) Duplicate(inbox.Message)         { c.dups.Add(1) }
func (c *counting) OutOfOrder(inbox.Message, int64) { c.ooo.Add(1) }
func (c *counting) Gap(m inbox.Message, mark int64) {
	c.gaps.Add(1)
	c.lastGap.Store(fmt.Sprintf("%s@%d>%d", m.Key, m.Seq, mark))
}

func seqs(as []inboxtest.Applied) []int64 {
	out := make([]int64, len(as))
	for i, a := range as {
		out[i] = a.Seq
	}
	return out
}

// The hot path is one statement per message, and one per batch: counted
// on the wire with a pgx tracer.
func TestOneStatementPerMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	cfg := e.pool.Config().Copy()
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	before := tr.n.Load()
	for _, m := range []inbox.Message{msg("k", 1), msg("k", 2), msg("", 0)} {
		_, err := e.in.Accept(ctx, tx, m)
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, tr.n.Load()-before, "one statement per message")
	before = tr.n.Load()
	_, err = e.in.AcceptBatch(ctx, tx, []inbox.Message{msg("k", 3), msg("k", 4), msg("j", 5), msg("", 0)})
	require.NoError(t, err)
	require.EqualValues(t, 1, tr.n.Load()-before, "one statement per batch")
}

type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Key marks idle for longer than KeyWindow are removed in small batches;
// a key a consumer is advancing, or another Prune holds, is skipped; a
// pruned key starts over.
func TestPruneKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	keysT, msgsT := pgx.Identifier{e.schema, "inbox_keys"}.Sanitize(), pgx.Identifier{e.schema, "inbox_messages"}.Sanitize()
	run := func(m inbox.Message) inbox.Outcome {
		t.Helper()
		o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		return o
	}
	// age makes keys (and their messages) idle for two days.
	age := func(keys ...string) {
		t.Helper()
		_, err := e.pool.Exec(ctx, "UPDATE "+keysT+" SET touched_at = now() - interval '2 days' WHERE key = ANY($1)", keys)
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, "UPDATE "+msgsT+" SET processed_at = now() - interval '2 days' WHERE key = ANY($1)", keys)
		require.NoError(t, err)
	}
	left := func() []string {
		t.Helper()
		rows, err := e.pool.Query(ctx, "SELECT key FROM "+keysT+" ORDER BY key")
		require.NoError(t, err)
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ks
	}
	day := 24 * time.Hour

	_, err := e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: time.Hour})
	require.ErrorContains(t, err, "KeyWindow")
	_, err = e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: -day})
	require.ErrorContains(t, err, "KeyWindow")

	// The statement that advances a mark stamps the key's touched_at.
	first := msg("a", 10)
	run(first)
	age("a")
	var idle bool
	run(msg("a", 11))
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT touched_at < now() - interval '1 day' FROM "+keysT+" WHERE key = 'a'").Scan(&idle))
	require.False(t, idle, "a new message touches its key")

	old := map[string]inbox.Message{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		old[k] = msg(k, 10)
		if k == "a" {
			old[k] = first
		}
		if k != "a" {
			run(old[k])
		}
	}
	run(msg("z", 10)) // z stays busy
	age("a", "b", "c", "d", "e", "f")

	// Small batches: one batch of 2 removes 2 ids and 2 marks, the first
	// keys in key order.
	n, err := e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: day, BatchSize: 2, MaxBatches: 1})
	require.NoError(t, err)
	require.Equal(t, inbox.Pruned{Messages: 2, Keys: 2}, n)
	require.Equal(t, []string{"c", "d", "e", "f", "z"}, left())

	// A consumer advancing idle key c holds its row: Prune skips it, and
	// does not wait for it.
	held, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer held.Rollback(ctx) //nolint:errcheck // test cleanup
	o, err := e.in.Accept(ctx, held, msg("c", 12))
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, o)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err = e.in.Prune(pctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: day, BatchSize: 2})
	require.NoError(t, err)
	require.EqualValues(t, 3, n.Keys, "d, e and f")
	require.Equal(t, []string{"c", "z"}, left())
	require.NoError(t, held.Commit(ctx))
	n, err = e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: day})
	require.NoError(t, err)
	require.Zero(t, n.Keys, "c was touched by the consumer's commit")

	// What removing a mark means. A fresh message of a pruned key is
	// processed, even below the old mark (it is no longer known as out
	// of order); a redelivery whose id was pruned too is applied again;
	// a key whose mark is kept still reports one.
	require.Equal(t, inbox.Processed, run(msg("b", 20)))
	require.Equal(t, inbox.Processed, run(msg("d", 5)))
	require.Equal(t, inbox.Processed, run(old["e"]))
	_, err = e.in.Run(ctx, e.pool, msg("z", 5), e.apply(msg("z", 5)))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder)
	_, err = e.in.Run(ctx, e.pool, msg("d", 4), e.apply(msg("d", 4)))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder, "d's new mark applies")

	// Concurrent prunes skip each other's rows: together they remove each
	// idle key once, without an error.
	var many []string
	for i := range 300 {
		k := fmt.Sprintf("m%03d", i)
		many = append(many, k)
		run(msg(k, int64(i+1)))
	}
	age(many...)
	var wg sync.WaitGroup
	var total, ids atomic.Int64
	for range 4 {
		wg.Go(func() {
			n, err := e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: day, KeyWindow: day, BatchSize: 10})
			assert.NoError(t, err)
			total.Add(n.Keys)
			ids.Add(n.Messages)
		})
	}
	wg.Wait()
	require.EqualValues(t, 300, total.Load())
	require.EqualValues(t, 300, ids.Load())
	require.Equal(t, []string{"b", "c", "d", "e", "z"}, left())
}

// An inbox created before touched_at (version 1) upgrades in place: its
// keys keep their marks and count as touched at the upgrade.
func TestMigrateAddsTouchedAt(t *testing.T) {
	t.Parallel()
	pool := inboxtest.Pool(t)
	ctx := t.Context()
	schema := "inbox_v1_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	script, err := inbox.Script(schema)
	require.NoError(t, err)
	v1, _, ok := strings.Cut(script, "\n-- 002_")
	require.True(t, ok, "the script has a second migration")
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Conn().PgConn().Exec(ctx, v1+"\nCOMMIT;").ReadAll()
	conn.Release()
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+schema+".inbox_keys (key, mark) VALUES ('acct', 7)")
	require.NoError(t, err)

	applied, err := inbox.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []int{2, 3}, applied)
	var fresh bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT touched_at > now() - interval '1 minute' FROM "+schema+".inbox_keys WHERE key = 'acct'").Scan(&fresh))
	require.True(t, fresh)
	in, err := inbox.New(inbox.Config{Schema: schema})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	_, err = in.Accept(ctx, tx, msg("acct", 5))
	require.ErrorIs(t, err, inbox.ErrOutOfOrder, "the mark survived the upgrade")
	require.NoError(t, tx.Rollback(ctx))
	// The upgrade's marks are the unnamed producer's: a named producer's
	// message of the key starts its own.
	named := msg("acct", 5)
	named.Producer = "billing"
	o, err := in.Run(ctx, pool, named, func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, o)
}

// The red team's case: a consumer of two producers whose keys overlap,
// producer A's positions around 1000 and B's from 1. Each producer's key
// has its own mark, so B's messages are not below A's: all 20 are applied
// once, each producer's key in its order, one at a time and in batches
// that mix them.
func TestProducersKeepTheirOwnMarks(t *testing.T) {
	t.Parallel()
	keys := []string{"acct-1", "acct-2", "acct-3"}
	events := func(producer string, first int64) []inbox.Message {
		var ms []inbox.Message
		for i := range int64(10) {
			m := msg(keys[i%3], first+i)
			m.Producer = producer
			ms = append(ms, m)
		}
		return ms
	}
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			t.Parallel()
			e := setup(t, inbox.Config{})
			ctx := t.Context()
			a, b := events("A", 1000), events("B", 1)
			producerOf := map[string]string{}
			for i := range a {
				producerOf[a[i].ID], producerOf[b[i].ID] = "A", "B"
			}
			// A's events all arrive first, then B's, as when A's relay
			// caught up before B's; then every event is redelivered.
			all := append(append([]inbox.Message(nil), a...), b...)
			all = append(all, all...)
			if batched {
				for i := 0; i < len(all); i += 7 {
					part := all[i:min(i+7, len(all))]
					_, err := e.in.RunBatch(ctx, e.pool, part, func(ctx context.Context, tx pgx.Tx, j int) error {
						return inboxtest.Effect(ctx, tx, e.schema, part[j])
					})
					require.NoError(t, err)
				}
			} else {
				for i, m := range all {
					o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
					require.NoError(t, err)
					want := inbox.Processed
					if i >= len(all)/2 {
						want = inbox.Duplicate
					}
					require.Equal(t, want, o, "delivery %d", i)
				}
			}
			got := e.effects(t)
			require.Len(t, got, 20, "each of the 20 events applied once")
			last := map[string]int64{}
			for _, x := range got {
				at := producerOf[x.ID] + "/" + x.Key
				require.Greater(t, x.Seq, last[at], "%s applied out of its order", at)
				last[at] = x.Seq
			}
			require.Len(t, last, 6, "both producers' events of each key")

			// Below its own producer's mark, a message is out of order,
			// and the error names the producer.
			late := msg("acct-1", 5)
			late.Producer = "B"
			_, err := e.in.Run(ctx, e.pool, late, e.apply(late))
			var ooo *inbox.OutOfOrderError
			require.ErrorAs(t, err, &ooo)
			require.Equal(t, inbox.OutOfOrderError{ID: late.ID, Key: "acct-1", Producer: "B", Seq: 5, Mark: 10}, *ooo)
			require.Contains(t, err.Error(), `key "acct-1" of producer "B" at position 5`)
		})
	}
}

// A message without a producer keeps one mark per key, as before, apart
// from the named producers' marks; Config.Producer names it.
func TestUnnamedProducer(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	named := msg("acct-1", 1000)
	named.Producer = "A"
	for _, m := range []inbox.Message{named, msg("acct-1", 7)} {
		o, err := e.in.Run(ctx, e.pool, m, e.apply(m))
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, o, "the unnamed producer's key is not A's")
	}
	early := msg("acct-1", 6)
	_, err := e.in.Run(ctx, e.pool, early, e.apply(early))
	var ooo *inbox.OutOfOrderError
	require.ErrorAs(t, err, &ooo)
	require.Equal(t, inbox.OutOfOrderError{ID: early.ID, Key: "acct-1", Seq: 6, Mark: 7}, *ooo)
	require.Contains(t, err.Error(), `key "acct-1" at position 6`)

	asA, err := inbox.New(inbox.Config{Schema: e.schema, Producer: "A"})
	require.NoError(t, err)
	_, err = asA.Run(ctx, e.pool, early, e.apply(early))
	require.ErrorAs(t, err, &ooo, "Config.Producer names the unnamed message: A's mark is 1000")
	require.Equal(t, inbox.OutOfOrderError{ID: early.ID, Key: "acct-1", Producer: "A", Seq: 6, Mark: 1000}, *ooo)
	o, err := asA.Run(ctx, e.pool, named, e.apply(named))
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, o, "ids are one set, whoever names the producer")
	require.Equal(t, []int64{1000, 7}, seqs(e.effects(t)))
}

// Prune walks the marks by producer and key: one at a time, it removes
// each producer's idle mark of a key once, and keeps a busy one.
func TestPruneMarksPerProducer(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	for _, p := range []string{"", "A", "B"} {
		for _, k := range []string{"x", "y"} {
			m := msg(k, 3)
			m.Producer = p
			_, err := e.in.Run(ctx, e.pool, m, e.apply(m))
			require.NoError(t, err)
		}
	}
	_, err := e.pool.Exec(ctx, "UPDATE "+pgx.Identifier{e.schema, "inbox_keys"}.Sanitize()+" SET touched_at = now() - interval '2 days' WHERE (producer, key) <> ('A', 'y')")
	require.NoError(t, err)
	n, err := e.in.Prune(ctx, e.pool, inbox.PruneConfig{Window: 24 * time.Hour, KeyWindow: 24 * time.Hour, BatchSize: 1})
	require.NoError(t, err)
	require.EqualValues(t, 5, n.Keys)
	rows, err := e.pool.Query(ctx, "SELECT producer || '/' || key FROM "+pgx.Identifier{e.schema, "inbox_keys"}.Sanitize())
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"A/y"}, left)
}
