package kafkainbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/kafkainbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
)

// BenchmarkInboxCost measures what the inbox adds to a Kafka consumer: the
// same records (written by the relay's sink into kfake, 200 keys) are
// consumed by a plain consumer (fetch, a transaction with the effect,
// offset commit) and by kafkainbox.Consumer (the same, plus the inbox
// statement), in alternating rounds of the same run. The effect is an
// UPDATE of the record's account row. Each iteration is one round of
// 2,000 records each way; run it with -benchtime=3x. Reported: µs and
// statements (BEGIN and COMMIT included, counted with a pgx tracer) per
// record each way, and the time ratio (inbox/plain). Every round checks
// that each record credited its account once.
func BenchmarkInboxCost(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			const records, keys = 2000, 200
			e := setup(b, 1)
			e.send(b, transfers(records, keys)...)
			accounts := make([]string, keys)
			for i := range accounts {
				accounts[i] = fmt.Sprintf("acct-%d", i)
			}
			inboxtest.Accounts(b, e.pool, e.schema, accounts)
			plainDB, plainSt := inboxtest.Counted(b, e.pool)
			inboxDB, inboxSt := inboxtest.Counted(b, e.pool)
			effect := func(ctx context.Context, tx pgx.Tx, r kafka.Message) error {
				return inboxtest.Credit(ctx, tx, e.schema, string(r.Key), 1)
			}
			in, err := inbox.New(inbox.Config{Schema: e.schema})
			if err != nil {
				b.Fatal(err)
			}
			credited := func(before int64) int64 {
				b.Helper()
				after := inboxtest.Balance(b, e.pool, e.schema)
				if after-before != records {
					b.Fatalf("%d records credited %d", records, after-before)
				}
				return after
			}
			balance := inboxtest.Balance(b, e.pool, e.schema)
			var plain, withInbox time.Duration
			for i := 0; b.Loop(); i++ {
				plain += consumeAll(b, records, e.reader(b, fmt.Sprintf("plain-%d", i)), func(ctx context.Context, r kafkainbox.Reader, rs []kafka.Message) error {
					tx, err := plainDB.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
					for _, rec := range rs {
						if _, err := kafkainbox.Message(rec); err != nil { // as the inbox consumer reads it
							return err
						}
						if err := effect(ctx, tx, rec); err != nil {
							return err
						}
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					return r.CommitMessages(ctx, rs...)
				}, batch)
				balance = credited(balance)
				withInbox += consumeAll(b, records, e.reader(b, fmt.Sprintf("inbox-%d", i)), func(ctx context.Context, r kafkainbox.Reader, rs []kafka.Message) error {
					c := &kafkainbox.Consumer{Reader: r, Inbox: in, DB: inboxDB, Handle: effect}
					return c.Process(ctx, rs...)
				}, batch)
				balance = credited(balance)
				// The next round's inbox starts empty, as the first did.
				if _, err := e.pool.Exec(b.Context(), "TRUNCATE "+pgx.Identifier{e.schema, "inbox_messages"}.Sanitize()+", "+pgx.Identifier{e.schema, "inbox_keys"}.Sanitize()); err != nil {
					b.Fatal(err)
				}
			}
			n := float64(b.N * records)
			b.ReportMetric(float64(plain.Microseconds())/n, "µs/record-plain")
			b.ReportMetric(float64(withInbox.Microseconds())/n, "µs/record-inbox")
			b.ReportMetric(float64(plainSt.N())/n, "stmts/record-plain")
			b.ReportMetric(float64(inboxSt.N())/n, "stmts/record-inbox")
			b.ReportMetric(float64(withInbox)/float64(plain), "inbox/plain")
		})
	}
}

// consumeAll reads n records from r in batches of up to batch (the records
// already fetched, as kafkainbox.Consumer.Run collects them) and hands
// each batch to process. It returns the time from the first record to the
// last processed, leaving out the group join.
func consumeAll(b *testing.B, n int, r *kafka.Reader, process func(ctx context.Context, r kafkainbox.Reader, rs []kafka.Message) error, batch int) time.Duration {
	b.Helper()
	ctx := b.Context()
	first, err := r.FetchMessage(ctx)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	pending := []kafka.Message{first}
	for done := 0; done < n; {
		for len(pending) < batch && done+len(pending) < n {
			fctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			rec, err := r.FetchMessage(fctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			pending = append(pending, rec)
		}
		if len(pending) == 0 {
			rec, err := r.FetchMessage(ctx)
			if err != nil {
				b.Fatal(err)
			}
			pending = append(pending, rec)
			continue
		}
		if err := process(ctx, r, pending); err != nil {
			b.Fatal(err)
		}
		done += len(pending)
		pending = pending[:0]
	}
	return time.Since(start)
}
