package httpinbox_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/httpinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// BenchmarkInboxCost measures what the inbox adds to a webhook receiver:
// the relay's HTTP sink posts the same batches (100 messages over 100
// keys, signed) to a plain receiver (verify the signature, a transaction
// with the effect, 204) and to httpinbox.Handler (the same, plus the
// inbox statement), each behind a real HTTP server (httptest, loopback),
// alternating batch by batch in the same run. The effect is an UPDATE of
// the message's account row. Each iteration is 2,000 webhooks each way;
// run it with -benchtime=3x. Reported: µs and statements (BEGIN and
// COMMIT included, counted with a pgx tracer) per webhook each way, and
// the time ratio (inbox/plain). The run checks that each webhook credited
// its account once.
func BenchmarkInboxCost(b *testing.B) {
	const messages, batch = 2000, 100
	pool, schema := inboxtest.Schema(b)
	accounts := make([]string, batch)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acct-%d", i)
	}
	inboxtest.Accounts(b, pool, schema, accounts)
	plainDB, plainSt := inboxtest.Counted(b, pool)
	inboxDB, inboxSt := inboxtest.Counted(b, pool)
	in, err := inbox.New(inbox.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	v, err := httpinbox.NewVerifier([]string{secret}, 0)
	if err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, r *httpinbox.Request) error {
		return inboxtest.Credit(ctx, tx, schema, r.Message.Key, 1)
	}
	withInbox := &httpinbox.Handler{Verifier: v, Inbox: in, DB: inboxDB, Handle: effect}
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body", http.StatusServiceUnavailable)
			return
		}
		if err := v.Verify(r.Header, body); err != nil {
			http.Error(w, "signature", http.StatusUnauthorized)
			return
		}
		m, err := httpinbox.Message(r.Header)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		tx, err := plainDB.Begin(r.Context())
		if err == nil {
			defer tx.Rollback(r.Context()) //nolint:errcheck // no-op after commit
			err = effect(r.Context(), tx, &httpinbox.Request{Message: m, Header: r.Header, Body: body})
		}
		if err == nil {
			err = tx.Commit(r.Context())
		}
		if err != nil {
			http.Error(w, "not processed", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sinkTo := func(h http.Handler) *httpsink.Sink {
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		s, err := httpsink.New(httpsink.Config{URL: srv.URL + "/hook", Secrets: []sinkconf.Secret{sinkconf.Secret(secret)}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	toPlain, toInbox := sinkTo(plain), sinkTo(withInbox)
	// post sends one batch of 100 (one message per key) through s and
	// returns the time it took.
	post := func(s *httpsink.Sink, seq int64) time.Duration {
		msgs := make([]sinks.Message, batch)
		for j := range msgs {
			msgs[j] = sinks.Message{ID: uuid.NewString(), Seq: seq + int64(j) + 1, Topic: "transfers", Key: accounts[j],
				Payload: []byte(`{"amount":1}`), CreatedAt: time.Now(), ClaimedAt: time.Now(), Attempt: 1}
		}
		start := time.Now()
		if err := s.Send(b.Context(), msgs); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var tPlain, tInbox time.Duration
	seq := int64(0)
	for b.Loop() {
		for i := 0; i < messages; i += batch {
			tPlain += post(toPlain, seq)
			tInbox += post(toInbox, seq)
			seq += batch
		}
	}
	n := float64(b.N * messages)
	if got := inboxtest.Balance(b, pool, schema); got != 2*int64(n) {
		b.Fatalf("%d webhooks each way credited %d", int64(n), got)
	}
	b.ReportMetric(float64(tPlain.Microseconds())/n, "µs/webhook-plain")
	b.ReportMetric(float64(tInbox.Microseconds())/n, "µs/webhook-inbox")
	b.ReportMetric(float64(plainSt.N())/n, "stmts/webhook-plain")
	b.ReportMetric(float64(inboxSt.N())/n, "stmts/webhook-inbox")
	b.ReportMetric(float64(tInbox)/float64(tPlain), "inbox/plain")
}
