package operator_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// Replay the dead letters of one topic, after looking at what a replay
// would do.
func ExampleAdmin_Replay() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	admin, err := operator.New(pool, "outbox")
	if err != nil {
		log.Fatal(err)
	}
	sel := operator.Selection{Topic: "orders"}
	plan, err := admin.Replay(ctx, sel, operator.ReplayOptions{DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range plan.DeadLetters {
		if d.Outcome == operator.ReplaySkipped {
			fmt.Println(d.ID, d.Reason)
		}
	}
	res, err := admin.Replay(ctx, sel, operator.ReplayOptions{})
	if errors.Is(err, operator.ErrEmptySelection) {
		log.Fatal("name the dead letters to replay")
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed", res.Count(operator.Replayed))
}

// Page through every dead letter.
func ExampleAdmin_List() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	admin, err := operator.New(pool, "")
	if err != nil {
		log.Fatal(err)
	}
	sel := operator.Selection{Limit: 500}
	for {
		page, err := admin.List(ctx, sel)
		if err != nil {
			log.Fatal(err)
		}
		if len(page) == 0 {
			return
		}
		for _, d := range page {
			fmt.Println(d.ID, d.Route, d.Topic, d.Reason)
		}
		last := page[len(page)-1]
		sel.AfterID, sel.AfterRoute = last.ID, last.Route
	}
}
