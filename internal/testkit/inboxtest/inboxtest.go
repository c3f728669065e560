// Package inboxtest holds what the inbox's tests and its adapters' tests
// share: a fresh migrated inbox schema per test, and an effects table the
// tests' handlers write to, so that a test can count and order what was
// applied.
package inboxtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// Pool connects to the test database (failing under CI=true, skipping
// elsewhere when it is unreachable).
func Pool(t testing.TB) *pgxpool.Pool { return pgtest.Pool(t) }

// Schema creates a fresh schema with the inbox tables and an effects
// table, dropped when the test ends.
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := inbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("inbox migrate %q: %v", schema, err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "effects"}.Sanitize()+
		" (n bigserial PRIMARY KEY, message_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL, payload text NOT NULL DEFAULT '')"); err != nil {
		t.Fatalf("effects table: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %q: %v", schema, err)
		}
	})
	return pool, schema
}

// Applied is one row of the effects table.
type Applied struct {
	ID      string
	Key     string
	Seq     int64
	Payload string
}

// Effect applies m's effect in tx: one row in schema's effects table.
func Effect(ctx context.Context, tx pgx.Tx, schema string, m inbox.Message) error {
	return EffectPayload(ctx, tx, schema, m, "")
}

// EffectPayload is Effect with the message's payload kept.
func EffectPayload(ctx context.Context, tx pgx.Tx, schema string, m inbox.Message, payload string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "effects"}.Sanitize()+" (message_id, key, seq, payload) VALUES ($1, $2, $3, $4)",
		m.ID, m.Key, m.Seq, payload)
	return err
}

// Effects returns the effects applied in schema, in the order they were.
func Effects(t testing.TB, pool *pgxpool.Pool, schema string) []Applied {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT message_id::text, key, seq, payload FROM "+pgx.Identifier{schema, "effects"}.Sanitize()+" ORDER BY n")
	if err != nil {
		t.Fatalf("effects: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Applied, error) {
		var a Applied
		err := r.Scan(&a.ID, &a.Key, &a.Seq, &a.Payload)
		return a, err
	})
	if err != nil {
		t.Fatalf("effects: %v", err)
	}
	return out
}

// Accounts creates schema's accounts table (id text, balance bigint) with
// one row per key, balance 0: the benchmarks' effect is an UPDATE of one.
func Accounts(t testing.TB, pool *pgxpool.Pool, schema string, keys []string) {
	t.Helper()
	ctx := context.Background()
	table := pgx.Identifier{schema, "accounts"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatalf("accounts table: %v", err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (id) SELECT unnest($1::text[])", keys); err != nil {
		t.Fatalf("accounts: %v", err)
	}
}

// Credit adds amount to account key's balance in tx: one UPDATE, the
// effect of a message in the benchmarks.
func Credit(ctx context.Context, tx pgx.Tx, schema, key string, amount int64) error {
	_, err := tx.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "accounts"}.Sanitize()+" SET balance = balance + $1 WHERE id = $2", amount, key)
	return err
}

// Balance returns the sum of schema's account balances.
func Balance(t testing.TB, pool *pgxpool.Pool, schema string) int64 {
	t.Helper()
	var sum int64
	if err := pool.QueryRow(context.Background(), "SELECT coalesce(sum(balance), 0)::bigint FROM "+pgx.Identifier{schema, "accounts"}.Sanitize()).Scan(&sum); err != nil {
		t.Fatalf("balance: %v", err)
	}
	return sum
}

// Counted returns a pool like pool whose statements are counted (every
// query and exec, BEGIN and COMMIT included), closed when the test ends.
func Counted(t testing.TB, pool *pgxpool.Pool) (*pgxpool.Pool, *Statements) {
	t.Helper()
	cfg := pool.Config().Copy()
	st := &Statements{}
	cfg.ConnConfig.Tracer = st
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("counted pool: %v", err)
	}
	t.Cleanup(p.Close)
	return p, st
}

// Statements counts the statements a pool sends (a pgx.QueryTracer).
type Statements struct{ n atomic.Int64 }

// N returns the statements sent so far.
func (s *Statements) N() int64 { return s.n.Load() }

// TraceQueryStart counts one statement.
func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (s *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
