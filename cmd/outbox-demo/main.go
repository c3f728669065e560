// Command outbox-demo is a tiny application that places orders: each order
// row and its OrderPlaced event are written in one transaction with
// outbox.Write. Some transactions are rolled back on purpose: their events
// must never reach the sink. `make demo` and docker-compose.yml use it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func main() {
	url := flag.String("database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"), "Postgres URL (env DATABASE_URL)")
	schema := flag.String("schema", envOr("OUTBOX_SCHEMA", "outbox"), "outbox schema (env OUTBOX_SCHEMA)")
	orders := flag.Int("orders", 6, "orders to place")
	every := flag.Duration("every", 300*time.Millisecond, "pause between orders")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("demo app: ")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, *url)
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: *schema})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS demo_orders (
		id text PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatalf("create demo_orders: %v", err)
	}
	run := strconv.FormatInt(time.Now().UnixNano()%1e10, 36)
	for i := 1; i <= *orders; i++ {
		id := fmt.Sprintf("o-%s-%d", run, i)
		customer := fmt.Sprintf("c-%d", i%2)
		rollback := i%3 == 0 // every third order fails after writing
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO demo_orders (id, customer, total_cents) VALUES ($1, $2, $3)`, id, customer, 1000*i); err != nil {
				return err
			}
			if err := w.Write(ctx, tx, outbox.Message{
				Topic:   "orders",
				Key:     customer, // a customer's events stay in order
				Payload: []byte(fmt.Sprintf(`{"order_id":%q,"customer":%q,"total_cents":%d}`, id, customer, 1000*i)),
				Headers: map[string]string{"type": "OrderPlaced", "content-type": "application/json"},
			}); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		switch {
		case err == errRollback:
			log.Printf("order %s rolled back: neither the order nor its event exists", id)
		case err != nil:
			log.Fatalf("order %s: %v", id, err)
		default:
			log.Printf("order %s committed with its event", id)
		}
		time.Sleep(*every)
	}
}

var errRollback = fmt.Errorf("demo: simulated failure after writing")

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
