package inbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// BenchmarkTouchedAt measures what stamping the key's touched_at costs
// the hot path: the same messages (over 100 keys, a transaction each, as a
// consumer without batches runs them) go through Accept's statement with
// and without ", touched_at = now()", alternating every 50 messages in the
// same run (so that the machine's slow and fast spells hit both), on one
// connection. Reported: µs per message each way, their ratio, and the
// share of the key table's updates that were HOT (no index entry).
func BenchmarkTouchedAt(b *testing.B) {
	const messages, keys, chunk = 2000, 100, 50
	pool, schema := pgtest.Schema(b)
	ctx := b.Context()
	if _, err := Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	in, err := New(Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	without := strings.Replace(in.one, ", touched_at = now()", "", 1)
	if without == in.one {
		b.Fatal("the statement does not stamp touched_at")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	seq := int64(0)
	round := func(stmt string) time.Duration {
		start := time.Now()
		for i := range chunk {
			seq++
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				var fresh bool
				var mark int64
				return tx.QueryRow(ctx, stmt, uuid.NewString(), fmt.Sprintf("acct-%d", i%keys), seq, "").Scan(&fresh, &mark)
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	var with, plain time.Duration
	for b.Loop() {
		for range messages / chunk {
			plain += round(without)
			with += round(in.one)
		}
	}
	n := float64(b.N * messages)
	b.ReportMetric(float64(plain.Microseconds())/n, "µs/msg-without")
	b.ReportMetric(float64(with.Microseconds())/n, "µs/msg-touched")
	b.ReportMetric(float64(with)/float64(plain), "touched/without")
	// The HOT share needs this connection's statistics flushed
	// (pg_stat_force_next_flush, Postgres 15); without it, it is left out.
	var upd, hot int64
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		b.Logf("no HOT share: %v", err)
		return
	}
	if err := conn.QueryRow(context.WithoutCancel(ctx), "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'inbox_keys'", schema).Scan(&upd, &hot); err != nil {
		b.Fatal(err)
	}
	if upd > 0 {
		b.ReportMetric(100*float64(hot)/float64(upd), "%hot-updates")
	}
}
