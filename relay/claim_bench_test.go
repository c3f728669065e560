package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
			// As the relay does: the priority probe pipelined with the
			// claim.
			claims(b, pool, schema, store.Outbox, "", func(i int) store.ClaimParams {
				return store.ClaimParams{
					Relay: "me", Workers: 2, Worker: i % 2, Rotation: (i * 2) % 256,
					Limit: 500, MaxBytes: DefaultBatchBytes, Priority: c.priority,
				}
			}, func(n int) {
				if n == 0 {
					b.Fatal("claimed nothing")
				}
			})
		})
	}
}

// claims gives every lane of route to relay "me", vacuums the outbox and
// the copies of schema and runs b.N claims of source with the params of
// each on one connection: BEGIN, the claim, every row scanned (check is
// told how many), ROLLBACK.
func claims(b *testing.B, pool *pgxpool.Pool, schema string, source store.Source, route string, params func(i int) store.ClaimParams, check func(n int)) {
	ctx := context.Background()
	s := migrations.Ident(schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.lanes (route, lane, owner, lease_until)
SELECT $1, g, 'me', now() + interval '1 hour' FROM generate_series(0, 255) g
ON CONFLICT (route, lane) DO UPDATE SET owner = 'me', lease_until = now() + interval '1 hour'`, route); err != nil {
		b.Fatal(err)
	}
	for _, table := range []string{"messages", "deliveries"} {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table); err != nil {
			b.Fatal(err)
		}
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
	e := store.NewEngine(st, source, route, false)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		batch := &pgx.Batch{}
		var prio bool
		n := 0
		e.QueueClaim(batch, params(i), &prio, func(store.ClaimedRow) error { n++; return nil })
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			b.Fatal(err)
		}
		check(n)
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimBesideBacklog measures what another route's backlog costs
// a route's claim. The route "audit" has 2 messages in each lane;
// "orders" (whose destination is down, say) has 0 to 200k. BEGIN, the
// audit claim over this worker's half of the lanes, scan, ROLLBACK.
//
// shared: the routes share the outbox table, so a claim over all of a
// worker's lanes (a woken worker's at least once a second, and every
// safety-net poll's) walks past the other route's rows in each lane.
// isolated (SetConfig.IsolateRoutes): each route claims its own copies,
// whose index leads with the route, and never reads the other's.
func BenchmarkClaimBesideBacklog(b *testing.B) {
	for _, isolated := range []bool{false, true} {
		for _, backlog := range []int{0, 10_000, 50_000, 200_000} {
			mode, source := "shared", store.Outbox
			if isolated {
				mode, source = "isolated", store.Copies
			}
			b.Run(fmt.Sprintf("%s/other=%d", mode, backlog), func(b *testing.B) {
				pool, schema := pgtest.Schema(b)
				ctx := context.Background()
				s := migrations.Ident(schema)
				if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $1::int) g`, backlog); err != nil {
					b.Fatal(err)
				}
				// Written after the backlog: each lane's audit rows are
				// behind the other route's.
				if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, key, payload)
SELECT 'audit', NULL, convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 512) g`); err != nil {
					b.Fatal(err)
				}
				topics := likePatterns([]string{"audit"})
				if isolated {
					// As the router leaves them: every row copied to its
					// route, the outbox empty.
					if _, err := pool.Exec(ctx, `WITH m AS (DELETE FROM `+s+`.messages RETURNING *)
INSERT INTO `+s+`.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at)
SELECT m.topic, m.id, m.message_id, m.topic, m.key, m.payload, m.headers, m.lane, m.created_at FROM m`); err != nil {
						b.Fatal(err)
					}
					topics = nil
				}
				claims(b, pool, schema, source, "audit", func(i int) store.ClaimParams {
					return store.ClaimParams{
						Relay: "me", Workers: 2, Worker: i % 2, Rotation: (i * 2) % 256,
						Limit: 500, LaneLimit: 500, MaxBytes: DefaultBatchBytes, Topics: topics,
					}
				}, func(n int) {
					if n != 256 {
						b.Fatalf("claimed %d audit messages, want 256", n)
					}
				})
			})
		}
	}
}
