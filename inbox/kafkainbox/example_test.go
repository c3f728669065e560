package kafkainbox_test

import (
	"context"
	"encoding/json"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/kafkainbox"
)

// A complete consumer: each transfer posted to its account once, in write
// order per account, whatever the redeliveries.
func Example() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := inbox.Migrate(ctx, db, "inbox"); err != nil {
		log.Fatal(err)
	}
	in, _ := inbox.New(inbox.Config{Schema: "inbox"})
	c := &kafkainbox.Consumer{
		Reader: kafka.NewReader(kafka.ReaderConfig{
			Brokers: []string{"localhost:9092"}, GroupID: "ledger", Topic: "transfers"}),
		Inbox: in, DB: db, MaxBatch: 100,
		Handle: func(ctx context.Context, tx pgx.Tx, r kafka.Message) error {
			var t struct{ Amount int64 }
			if err := json.Unmarshal(r.Value, &t); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, t.Amount, string(r.Key))
			return err
		},
	}
	log.Fatal(c.Run(ctx))
}
