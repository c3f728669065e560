package httpinbox_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/httpinbox"
)

// A complete webhook receiver: the signature checked first, each transfer
// posted once, 204 only after the commit.
func Example() {
	db, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	verifier, err := httpinbox.NewVerifier([]string{os.Getenv("WEBHOOK_SECRET")}, 0) // whsec_...
	if _, merr := inbox.Migrate(context.Background(), db, "inbox"); err != nil || merr != nil {
		log.Fatal(err, merr)
	}
	in, _ := inbox.New(inbox.Config{Schema: "inbox"})
	http.Handle("POST /hooks/transfers", &httpinbox.Handler{
		Verifier: verifier, Inbox: in, DB: db,
		Handle: func(ctx context.Context, tx pgx.Tx, r *httpinbox.Request) error {
			var t struct{ Amount int64 }
			if err := json.Unmarshal(r.Body, &t); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, t.Amount, r.Message.Key)
			return err
		},
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}
