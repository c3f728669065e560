package httpinbox_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
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
	h      *httpinbox.Handler
	dups   atomic.Int64
	// failNext makes the handler fail once, after its effect.
	failNext atomic.Bool
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
			if err := inboxtest.EffectPayload(ctx, tx, schema, r.Message, string(r.Body)); err != nil {
				return err
			}
			if e.failNext.CompareAndSwap(true, false) {
				return errors.New("the handler failed")
			}
			return nil
		}}
	e.h = h
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
	h.Set("Outbox-Producer", "7713292241186691262/orders/outbox")
	m, err = httpinbox.Message(h)
	require.NoError(t, err)
	require.Equal(t, "7713292241186691262/orders/outbox", m.Producer)
	h.Set("outbox-seq", "-1")
	_, err = httpinbox.Message(h)
	require.ErrorIs(t, err, httpinbox.ErrHeaders)
}

type hooks struct{ dups *atomic.Int64 }

func (h hooks) Duplicate(inbox.Message)         { h.dups.Add(1) }
func (h hooks) OutOfOrder(inbox.Message, int64) {}
func (h hooks) Gap(inbox.Message, int64)        {}

// Which answer each case gets, read off the wire: the relay tells a
// message's own failure (500 with Outbox-Failure: message, retried and
// dead-lettered after its attempts) from a receiver that may be down (a
// 5xx without it, 503 here only when the request itself broke) and from
// what no retry can fix (4xx).
func TestAnswers(t *testing.T) {
	t.Parallel()
	e := setup(t, secret)
	first := uuid.NewString()
	unsigned := signed(t, uuid.NewString(), "22", nil)
	unsigned.Header.Del("webhook-signature")
	cases := []struct {
		name    string
		req     *http.Request
		fail    bool
		code    int
		failure string // the Outbox-Failure header
	}{
		{"processed", signed(t, first, "20", nil), false, http.StatusNoContent, ""},
		{"duplicate", signed(t, first, "20", nil), false, http.StatusNoContent, ""},
		{"out of order", signed(t, uuid.NewString(), "19", nil), false, http.StatusInternalServerError, httpinbox.FailureMessage},
		{"handler error", signed(t, uuid.NewString(), "21", nil), true, http.StatusInternalServerError, httpinbox.FailureMessage},
		{"bad signature", badSignature(signed(t, uuid.NewString(), "22", nil)), false, http.StatusUnauthorized, ""},
		{"signature headers missing", unsigned, false, http.StatusUnauthorized, ""},
		{"outbox-seq malformed", signed(t, uuid.NewString(), "not a position", nil), false, http.StatusBadRequest, ""},
		{"body not read", signed(t, uuid.NewString(), "23", iotest.ErrReader(errors.New("connection reset"))), false, http.StatusServiceUnavailable, ""},
	}
	for _, c := range cases {
		e.failNext.Store(c.fail)
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, c.req)
		require.Equal(t, c.code, rec.Code, c.name)
		require.Equal(t, c.failure, rec.Header().Get(httpinbox.HeaderFailure), c.name)
		if c.failure != "" {
			require.Equal(t, "1", rec.Header().Get("Retry-After"), c.name)
		}
	}
	got := inboxtest.Effects(t, e.pool, e.schema)
	require.Len(t, got, 1, "only the processed message applied; the handler's error rolled its effect back")
	require.Equal(t, first, got[0].ID)
}

// signed returns a webhook request of key "acct" at position seq (the
// outbox-seq header) signed as the relay's sink signs it. body, when set,
// is what the request's body reads.
func signed(t *testing.T, id, seq string, body io.Reader) *http.Request {
	t.Helper()
	payload := fmt.Sprintf(`{"seq":%q}`, seq)
	ts := fmt.Sprint(time.Now().Unix())
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte(id + "." + ts + "." + payload))
	if body == nil {
		body = strings.NewReader(payload)
	}
	r := httptest.NewRequest(http.MethodPost, "/hook", body)
	r.Header.Set("webhook-id", id)
	r.Header.Set("webhook-timestamp", ts)
	r.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	r.Header.Set("outbox-key", "acct")
	r.Header.Set("outbox-seq", seq)
	return r
}

func badSignature(r *http.Request) *http.Request {
	r.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
	return r
}

// Two producers post to one receiver with overlapping keys, A's
// positions around 1000 and B's from 1: the receiver keeps a mark per
// producer (the outbox-producer header the relay sets), so B's webhooks
// are applied after A's, not refused as out of order.
func TestTwoProducersOneReceiver(t *testing.T) {
	t.Parallel()
	require.Equal(t, sinks.HeaderProducer, httpinbox.HeaderProducer, "the header the relay sets")
	e := setup(t, secret)
	ctx := t.Context()
	var a, b []sinks.Message
	for i := range int64(10) {
		key := fmt.Sprintf("acct-%d", i%3)
		ma, mb := msg(key, 1000+i), msg(key, 1+i)
		ma.Headers = map[string]string{httpinbox.HeaderProducer: "A"}
		mb.Headers = map[string]string{httpinbox.HeaderProducer: "B"}
		a, b = append(a, ma), append(b, mb)
	}
	require.NoError(t, e.sink.Send(ctx, a))
	require.NoError(t, e.sink.Send(ctx, b))
	require.NoError(t, e.sink.Send(ctx, append(a[:3:3], b[:3]...)), "redeliveries are duplicates")
	require.Len(t, inboxtest.Effects(t, e.pool, e.schema), 20)
	require.EqualValues(t, 6, e.dups.Load())
	late := msg("acct-0", 2)
	late.Headers = map[string]string{httpinbox.HeaderProducer: "B"}
	require.Error(t, e.sink.Send(ctx, []sinks.Message{late}), "below B's own mark: out of order")
}
