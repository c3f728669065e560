package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	rcv := startInbox(t, pool, schema+"_inbox")
	effects := func() int { return len(rcv.effects(t)) }

	keys := keyNames("k", 10)
	commit(t, pool, schema, messages("orders", keys, 0, 20, nil))
	p := startRelay(t, pgtest.URL(), schema, append(stallFlags, "--sink", rcv.url)...)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		return effects() == 20, fmt.Sprintf("%d of 20 applied", effects())
	})

	_, err := pool.Exec(ctx, "TRUNCATE "+migrations.Ident(schema)+".messages RESTART IDENTITY")
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

// TestTwoOutboxesOneInbox: two outboxes (two schemas, so two producers by
// default) write messages of the same keys, and their relays deliver them
// to one webhook consumer built as docs/inbox.md shows. Each outbox numbers
// its own rows, so the second outbox's positions run below the marks the
// first one's left on the shared keys: with one mark per key the inbox
// refused them for good. Marks kept per producer, all 20 effects are
// applied once, each producer's in its own key order, and nothing is
// dead-lettered.
func TestTwoOutboxesOneInbox(t *testing.T) {
	t.Parallel()
	poolA, schemaA := pgtest.Schema(t)
	poolB, schemaB := pgtest.Schema(t)
	rcv := startInbox(t, poolA, schemaA+"_inbox")
	keys := keyNames("k", 3)

	commit(t, poolA, schemaA, messages("a", keys, 0, 10, nil))
	startRelay(t, pgtest.URL(), schemaA, append(stallFlags, "--sink", rcv.url)...)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := len(rcv.effects(t))
		return n == 10, fmt.Sprintf("%d of A's 10 applied", n)
	})
	commit(t, poolB, schemaB, messages("b", keys, 0, 10, nil))
	startRelay(t, pgtest.URL(), schemaB, append(stallFlags, "--sink", rcv.url)...)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := len(rcv.effects(t))
		return n == 20, fmt.Sprintf("%d of 20 applied", n)
	})

	applied := rcv.effects(t)
	require.Len(t, applied, 20, "each effect once")
	last := map[string]int{}
	producers := map[string]string{}
	for _, e := range applied {
		require.NotEmpty(t, e.producer, "%s: the relay names its outbox", e.payload)
		topic := e.payload[:1]
		if p, ok := producers[topic]; ok {
			require.Equal(t, p, e.producer, "one producer name per outbox")
		}
		producers[topic] = e.producer
		key, seq, ok := parsePayload(e.payload)
		require.True(t, ok, e.payload)
		at := topic + "/" + key
		if n, ok := last[at]; ok {
			require.Greater(t, seq, n, "%s applied out of its producer's order", e.payload)
		}
		last[at] = seq
	}
	require.NotEqual(t, producers["a"], producers["b"], "two outboxes, two producer names")
	require.Empty(t, deadLetters(t, poolA, schemaA))
	require.Empty(t, deadLetters(t, poolB, schemaB))
}

// inboxReceiver is a webhook consumer built as docs/inbox.md shows: it
// verifies the signature, records the message in an inbox and applies its
// effect (a row of effects) in the same transaction.
type inboxReceiver struct {
	url    string
	pool   *pgxpool.Pool
	schema string
}

// effect is one applied message: its producer and payload, in the order
// the consumer applied them.
type effect struct{ producer, payload string }

func startInbox(t *testing.T, pool *pgxpool.Pool, schema string) *inboxReceiver {
	t.Helper()
	ctx := context.Background()
	_, err := inbox.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+migrations.Ident(schema)+" CASCADE")
	})
	in, err := inbox.New(inbox.Config{Schema: schema})
	require.NoError(t, err)
	verifier, err := httpinbox.NewVerifier([]string{inboxSecret}, 0)
	require.NoError(t, err)
	table := migrations.Ident(schema) + ".effects"
	_, err = pool.Exec(ctx, "CREATE TABLE "+table+" (n bigserial PRIMARY KEY, producer text NOT NULL, payload text NOT NULL)")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /hook", &httpinbox.Handler{Verifier: verifier, Inbox: in, DB: pool,
		Handle: func(ctx context.Context, tx pgx.Tx, r *httpinbox.Request) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (producer, payload) VALUES ($1, $2)", r.Message.Producer, string(r.Body))
			return err
		}})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &inboxReceiver{url: srv.URL + "/hook?secret=" + inboxSecret, pool: pool, schema: schema}
}

// effects returns the applied messages in the order they were applied.
func (r *inboxReceiver) effects(t *testing.T) []effect {
	t.Helper()
	rows, err := r.pool.Query(context.Background(), "SELECT producer, payload FROM "+migrations.Ident(r.schema)+".effects ORDER BY n")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (effect, error) {
		var e effect
		return e, row.Scan(&e.producer, &e.payload)
	})
	require.NoError(t, err)
	return out
}
