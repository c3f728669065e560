package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/httpinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

const inboxSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestInboxOutOfOrderDeadLetters: the outbox is truncated with RESTART
// IDENTITY under a webhook consumer built as docs/inbox.md shows, so the
// new messages of known keys arrive below their keys' marks: out of
// order. The inbox refuses them as that message's failure, not as an
// outage: with --max-attempts 3 each is dead-lettered after its 3
// attempts, and the route goes on delivering new keys meanwhile. Before,
// the relay read the inbox's 503s across keys as the receiver being down
// and probed for ever, counting nothing.
func TestInboxOutOfOrderDeadLetters(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	inboxSchema := schema + "_inbox"
	_, err := inbox.Migrate(ctx, pool, inboxSchema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+migrations.Ident(inboxSchema)+" CASCADE")
	})
	in, err := inbox.New(inbox.Config{Schema: inboxSchema})
	require.NoError(t, err)
	verifier, err := httpinbox.NewVerifier([]string{inboxSecret}, 0)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE "+migrations.Ident(inboxSchema)+".effects (payload text NOT NULL)")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /hook", &httpinbox.Handler{Verifier: verifier, Inbox: in, DB: pool,
		Handle: func(ctx context.Context, tx pgx.Tx, r *httpinbox.Request) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+migrations.Ident(inboxSchema)+".effects VALUES ($1)", string(r.Body))
			return err
		}})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	effects := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+migrations.Ident(inboxSchema)+".effects").Scan(&n))
		return n
	}

	keys := keyNames("k", 10)
	commit(t, pool, schema, messages("orders", keys, 0, 20, nil))
	p := startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", srv.URL+"/hook?secret="+inboxSecret)...)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		return effects() == 20, fmt.Sprintf("%d of 20 applied", effects())
	})

	_, err = pool.Exec(ctx, "TRUNCATE "+migrations.Ident(schema)+".messages RESTART IDENTITY")
	require.NoError(t, err)
	commit(t, pool, schema, messages("orders", keys, 100, 10, nil))
	// New keys beside them, written while the known keys' messages fail.
	fresh := commit(t, pool, schema, []outbox.Message{
		{Topic: "orders", Key: "new1", Payload: []byte(payloadOf("orders", "new1", 1))},
		{Topic: "orders", Key: "new2", Payload: []byte(payloadOf("orders", "new2", 1))},
	})
	eventually(t, 90*time.Second, 100*time.Millisecond, func() (bool, string) {
		n, left := len(deadLetters(t, pool, schema)), count(t, pool, schema, "messages")
		return n == 10 && left == 0, fmt.Sprintf("%d dead letters, %d pending", n, left)
	})
	for _, d := range deadLetters(t, pool, schema) {
		require.Equal(t, relay.ReasonMaxAttempts, d.Reason)
		require.Equal(t, 3, d.Attempts)
	}
	require.Equal(t, 20+len(fresh), effects(), "the new keys applied, the out-of-order messages not")
	outages, _ := p.metric("outbox_relay_destination_outages_total")
	require.Zero(t, outages, "the inbox's answer read as the receiver being down")
}
