package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/outbox/outboxotel"
)

// The canonical use: the business row and the event commit together, or
// neither does.
func Example() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(1)
	}
	defer conn.Close(ctx)
	// Normally done once by `outbox-relay migrate`.
	if _, err := migrations.Apply(ctx, conn, "outbox"); err != nil {
		fmt.Println("migrate:", err)
		return
	}
	_, _ = conn.Exec(ctx, `CREATE TEMP TABLE orders (id text PRIMARY KEY, total int)`)

	placeOrder := func(id string, commit bool) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, 42)`, id); err != nil {
			return err
		}
		err = outbox.Write(ctx, tx, outbox.Message{
			Topic:   "example.orders",
			Key:     id, // events of one order are delivered in order
			Payload: []byte(`{"order":"` + id + `","total":42}`),
			Headers: map[string]string{"type": "OrderPlaced"},
		})
		if err != nil {
			return err
		}
		if !commit {
			return tx.Rollback(ctx)
		}
		return tx.Commit(ctx)
	}
	fmt.Println(placeOrder("o-1", true), placeOrder("o-2", false))

	var orders, events int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM outbox.messages WHERE topic = 'example.orders'`).Scan(&events)
	fmt.Println("orders:", orders, "events:", events)
	_, _ = conn.Exec(ctx, `DELETE FROM outbox.messages WHERE topic = 'example.orders'`)
	// Output:
	// <nil> <nil>
	// orders: 1 events: 1
}

// With database/sql the writer takes a *sql.Tx; a *sql.DB does not
// compile here, so the event cannot be written outside the transaction
// that changes the business rows.
func ExampleWriteSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", pgtest.URL())
	if err != nil {
		fmt.Println("open:", err)
		return
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println("begin:", err)
		return
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "o-1"); err != nil {
		fmt.Println("update:", err)
		return
	}
	if err := outbox.WriteSQL(ctx, tx, outbox.Message{Topic: "orders.paid", Key: "o-1", Payload: []byte(`{}`)}); err != nil {
		fmt.Println("write:", err)
		return
	}
	fmt.Println(tx.Commit())
}

// To store the trace context of a traced operation in every message, as
// the package-level Write did before the writer became tracing-free,
// configure the writer with outboxotel.TraceContext.
func ExampleWriterConfig_traceContext() {
	w, err := outbox.NewWriter(outbox.WriterConfig{Headers: outboxotel.TraceContext{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = w // w.Write(ctx, tx, msgs...) now adds traceparent when ctx is traced.
}
