package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// BenchmarkClaim measures the claim statement alone: BEGIN, claim a batch
// of 500 from a 200k backlog over 1,000 keys (this worker's half of the
// lanes, the default byte limit) and scan it, ROLLBACK. Compare runs with
// benchstat.
func BenchmarkClaim(b *testing.B) {
	for _, c := range []struct {
		name     string
		priority bool
	}{{"plain", false}, {"priority", true}} {
		b.Run(c.name, func(b *testing.B) {
			pool, schema := pgtest.Schema(b)
			ctx := context.Background()
			s := migrations.Ident(schema)
			_, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 200000) g`)
			if err != nil {
				b.Fatal(err)
			}
			if c.priority {
				// A handful of priority keys among the backlog.
				if _, err := pool.Exec(ctx, `UPDATE `+s+`.messages SET priority = 5 WHERE id IN (150000, 150001, 190000)`); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.lanes (route, lane, owner, lease_until)
SELECT '', g, 'me', now() + interval '1 hour' FROM generate_series(0, 255) g
ON CONFLICT (route, lane) DO UPDATE SET owner = 'me', lease_until = now() + interval '1 hour'`); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.messages`); err != nil {
				b.Fatal(err)
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			st, err := store.NewSchema(schema)
			if err != nil {
				b.Fatal(err)
			}
			e := store.NewEngine(st, store.Outbox, "", false)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tx, err := conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				// As the relay does: the priority probe pipelined with the
				// claim, every row scanned.
				batch := &pgx.Batch{}
				var prio bool
				n := 0
				e.QueueClaim(batch, store.ClaimParams{
					Relay: "me", Workers: 2, Worker: i % 2, Rotation: (i * 2) % 256,
					Limit: 500, MaxBytes: DefaultBatchBytes, Priority: c.priority,
				}, &prio, func(store.ClaimedRow) error { n++; return nil })
				if err := tx.SendBatch(ctx, batch).Close(); err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					b.Fatal("claimed nothing")
				}
				if err := tx.Rollback(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
