package httpinbox_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/httpinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/inboxtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))

type env struct {
	pool   *pgxpool.Pool
	schema string
	sink   *httpsink.Sink
	dups   atomic.Int64
	// killNext drops the connection after the handler's transaction
	// committed, before any answer: a receiver killed between its commit
	// and its 2xx.
	killNext atomic.Bool
}

func setup(t *testing.T, sinkSecret string) *env {
	t.Helper()
	pool, schema := inboxtest.Schema(t)
	e := &env{pool: pool, schema: schema}
	in, err := inbox.New(inbox.Config{Schema: schema, Hooks: hooks{&e.dups}})
	require.NoError(t, err)
	v, err := httpinbox.NewVerifier([]string{secret}, 0)
	require.NoError(t, err)
	h := &httpinbox.Handler{Verifier: v, Inbox: in, DB: pool,
		Handle: func(ctx context.Context, tx pgx.Tx, r *httpinbox.Request) error {
			return inboxtest.EffectPayload(ctx, tx, schema, r.Message, string(r.Body))
		}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.killNext.CompareAndSwap(true, false) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	s, err := httpsink.New(httpsink.Config{URL: srv.URL + "/hook", Secrets: []sinkconf.Secret{sinkconf.Secret(sinkSecret)}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	e.sink = s
	return e
}

func msg(key string, seq int64) sinks.Message {
	return sinks.Message{ID: uuid.NewString(), Seq: seq, Topic: "transfers", Key: key, Payload: fmt.Appendf(nil, `{"seq":%d}`, seq),
		CreatedAt: time.Now(), ClaimedAt: time.Now(), Attempt: 1}
}

// Webhooks sent by the relay's own sink: duplicates (a redelivery after
// later messages of the key) are acknowledged and skipped; a receiver
// killed between its commit and its answer applies nothing twice when the
// relay sends again.
func TestDuplicatesAndKilledBeforeAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t, secret)
	ctx := t.Context()
	a1, a2, a3 := msg("acct", 10), msg("acct", 11), msg("acct", 15)
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{a1, a2}))
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{a1}), "a late redelivery is acknowledged")

	// The answer to a3 is lost after its effect committed. Go's client
	// may resend the request itself (the sink sets Idempotency-Key, so
	// net/http retries a POST whose connection died before any answer
	// byte); otherwise the relay's retry does.
	e.killNext.Store(true)
	if err := e.sink.Send(ctx, []sinks.Message{a3}); err != nil {
		require.Len(t, inboxtest.Effects(t, e.pool, e.schema), 3, "the effect committed before the answer was lost")
		require.NoError(t, e.sink.Send(ctx, []sinks.Message{a3}), "the relay's retry is acknowledged")
	}

	got := inboxtest.Effects(t, e.pool, e.schema)
	require.Len(t, got, 3)
	for i, m := range []sinks.Message{a1, a2, a3} {
		require.Equal(t, m.ID, got[i].ID)
		require.Equal(t, m.Seq, got[i].Seq)
		require.Equal(t, "acct", got[i].Key)
		require.Equal(t, string(m.Payload), got[i].Payload)
	}
	require.EqualValues(t, 2, e.dups.Load())
}

// An out-of-order webhook is answered 500 with Outbox-Failure: message:
// the relay retries it as that message's failure (holding the key, never
// reading it as the receiver down) and nothing is applied.
func TestOutOfOrderIsRetriable(t *testing.T) {
	t.Parallel()
	e := setup(t, secret)
	ctx := t.Context()
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{msg("acct", 20)}))
	err := e.sink.Send(ctx, []sinks.Message{msg("acct", 19)})
	require.Error(t, err)
	require.False(t, sinks.IsPermanent(sinks.Outcome(err, 0, 1)), "out of order must be retried, not dead-lettered: %v", err)
	require.ErrorContains(t, err, "500")
	require.False(t, errors.Is(err, sinks.ErrUnavailable), "the inbox's answer read as an outage: %v", err)
	require.Equal(t, httpsink.HeaderFailure, httpinbox.HeaderFailure)
	require.Equal(t, httpsink.FailureMessage, httpinbox.FailureMessage)
	require.Len(t, inboxtest.Effects(t, e.pool, e.schema), 1)
}

// The signature is checked before anything else: a request signed with
// another secret, or not signed, is refused (401, which the relay does not
// retry) and applies nothing.
func TestSignatureVerifiedFirst(t *testing.T) {
	t.Parallel()
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret of 32 bytes......"))
	e := setup(t, other)
	err := e.sink.Send(t.Context(), []sinks.Message{msg("acct", 1)})
	require.True(t, sinks.IsPermanent(sinks.Outcome(err, 0, 1)), "%v", err)
	require.ErrorContains(t, err, "401")
	require.Empty(t, inboxtest.Effects(t, e.pool, e.schema))

	v, err := httpinbox.NewVerifier([]string{secret}, time.Minute)
	require.NoError(t, err)
	h := http.Header{}
	h.Set("webhook-id", "x")
	require.ErrorIs(t, v.Verify(h, nil), httpinbox.ErrSignature)
	h.Set("webhook-timestamp", fmt.Sprint(time.Now().Add(-time.Hour).Unix()))
	h.Set("webhook-signature", "v1,AAAA")
	require.ErrorContains(t, v.Verify(h, nil), "away from this clock")
	_, err = httpinbox.NewVerifier([]string{"nope"}, 0)
	require.ErrorContains(t, err, "secrets[0]")
}

func TestMessageFromHeaders(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	_, err := httpinbox.Message(h)
	require.ErrorIs(t, err, httpinbox.ErrHeaders)
	h.Set("webhook-id", "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50")
	h.Set("outbox-key", "order%2F42%20%C3%BC")
	h.Set("outbox-seq", "77")
	m, err := httpinbox.Message(h)
	require.NoError(t, err)
	require.Equal(t, inbox.Message{ID: "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", Key: "order/42 ü", Seq: 77}, m)
	h.Set("outbox-seq", "-1")
	_, err = httpinbox.Message(h)
	require.ErrorIs(t, err, httpinbox.ErrHeaders)
}

type hooks struct{ dups *atomic.Int64 }

func (h hooks) Duplicate(inbox.Message)         { h.dups.Add(1) }
func (h hooks) OutOfOrder(inbox.Message, int64) {}
func (h hooks) Gap(inbox.Message, int64)        {}
