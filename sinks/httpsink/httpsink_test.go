package httpsink

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Two valid secrets of 24 and 32 bytes; the first is the Standard Webhooks
// test vector's.
const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tdGVzdHM="
)

func msg(id, topic, key, payload string, headers map[string]string) sinks.Message {
	return sinks.Message{ID: id, Topic: topic, Key: key, Payload: []byte(payload), Headers: headers, Attempt: 1}
}

func TestSignMatchesStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	key, err := decodeSecret(secretA)
	require.NoError(t, err)
	got := signer{keys: [][]byte{key}}.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)

	// The test verifier agrees with the published vector too, so the
	// end-to-end tests below check against the spec, not against our signer.
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,bm9wZQ== "+got)
	require.NoError(t, verifySignature(secretA, h, []byte(`{"test": 2432232314}`), time.Unix(1614265330, 0), time.Minute))
}

func TestDecodeSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, err string
	}{
		{secretA, ""},
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"[:len(secretA)], ""},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with"},
		{"whsec_not base64!!", "not valid base64"},
		{"whsec_c2hvcnQ=", "shorter than"},
	} {
		_, err := decodeSecret(tc.in)
		if tc.err == "" {
			require.NoError(t, err, tc.in)
			continue
		}
		require.ErrorContains(t, err, tc.err)
		require.NotContains(t, err.Error(), strings.TrimPrefix(tc.in, "whsec_"), "secret leaked into the error")
	}
}

func TestSendSignedRequest(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/hook"), Secrets: []sinkconf.Secret{secretA, secretB}})

	payload := "{\"n\": 1, \"bytes\": \"\x00\xff\"}\n"
	m := msg("6f1c1c2e-0b7e-4d0e-9b8a-1f2e3d4c5b6a", "orders.created", "order/42 ü", payload,
		map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"})
	require.NoError(t, s.Send(context.Background(), []sinks.Message{m}))

	reqs := rc.requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Equal(t, "/hook", r.Path)
	require.Equal(t, []byte(payload), r.Body, "payload must arrive byte for byte")
	require.Equal(t, m.ID, r.Header.Get("webhook-id"))
	require.Equal(t, m.ID, r.Header.Get("Idempotency-Key"))
	require.Equal(t, "outbox-relay", r.Header.Get("User-Agent"))
	require.Equal(t, "application/octet-stream", r.Header.Get("Content-Type"))
	require.Equal(t, "orders.created", unescape(t, r.Header.Get(HeaderTopic)))
	require.Equal(t, "order/42 ü", unescape(t, r.Header.Get(HeaderKey)))
	require.Equal(t, m.Headers["traceparent"], r.Header.Get("traceparent"))
	require.Equal(t, "acme", r.Header.Get("x-tenant"))

	// Either secret verifies: that is what lets a receiver rotate.
	require.Len(t, strings.Fields(r.Header.Get("webhook-signature")), 2)
	require.NoError(t, verifySignature(secretA, r.Header, r.Body, time.Now(), 5*time.Second))
	require.NoError(t, verifySignature(secretB, r.Header, r.Body, time.Now(), 5*time.Second))
	other := "whsec_" + strings.Repeat("QUJD", 8)
	require.Error(t, verifySignature(other, r.Header, r.Body, time.Now(), 5*time.Second))
}

func TestSendWithoutSecretHasNoSignature(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/"), ContentType: "application/json"})
	require.NoError(t, s.Send(context.Background(), []sinks.Message{
		msg("id-1", "t", "", "{}", nil),
		msg("id-2", "t", "", "<x/>", map[string]string{"content-type": "application/xml"}),
	}))
	byID := map[string]request{}
	for _, r := range rc.requests() {
		byID[r.Header.Get("webhook-id")] = r
	}
	require.Empty(t, byID["id-1"].Header.Values("webhook-signature"))
	require.NotEmpty(t, byID["id-1"].Header.Get("webhook-timestamp"))
	require.Empty(t, byID["id-1"].Header.Values(HeaderKey), "no key header for a keyless message")
	require.Equal(t, "application/json", byID["id-1"].Header.Get("Content-Type"))
	require.Equal(t, []string{"application/xml"}, byID["id-2"].Header.Values("Content-Type"), "the message's own content-type wins")
}

// Userinfo in the URL goes as HTTP basic auth (docs/sinks/http.md).
func TestSendUserinfoAsBasicAuth(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: "http://hook:p%40ss@" + rc.addr + "/in"})
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("id-1", "t", "k", "{}", nil)}))
	reqs := rc.requests()
	require.Len(t, reqs, 1)
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("hook:p@ss"))
	require.Equal(t, want, reqs[0].Header.Get("Authorization"))
}

// statusRespond answers with the status in the x-want-status request header
// and copies x-retry-after into Retry-After.
func statusRespond(w http.ResponseWriter, r *http.Request, _ []byte) int {
	code, _ := strconv.Atoi(r.Header.Get("x-want-status"))
	if ra := r.Header.Get("x-retry-after"); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	if code >= 300 && code <= 399 {
		w.Header().Set("Location", "/elsewhere")
	}
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "answer %d", code)
	return code
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(statusRespond)
	def := newSink(t, Config{URL: rc.URL("/")})
	retry4xx := newSink(t, Config{URL: rc.URL("/"), Retry4xx: true})
	extra := newSink(t, Config{URL: rc.URL("/"), RetryStatuses: []int{409, 501}})

	const (
		ok = iota
		retriable
		permanent
	)
	for _, tc := range []struct {
		sink *Sink
		name string
		code int
		want int
	}{
		{def, "default", 200, ok}, {def, "default", 201, ok}, {def, "default", 202, ok}, {def, "default", 204, ok}, {def, "default", 299, ok},
		{def, "default", 301, permanent}, {def, "default", 302, permanent}, {def, "default", 303, permanent},
		{def, "default", 307, permanent}, {def, "default", 308, permanent},
		{def, "default", 400, permanent}, {def, "default", 401, permanent}, {def, "default", 403, permanent},
		{def, "default", 404, permanent}, {def, "default", 409, permanent}, {def, "default", 410, permanent},
		{def, "default", 413, permanent}, {def, "default", 422, permanent},
		{def, "default", 408, retriable}, {def, "default", 425, retriable}, {def, "default", 429, retriable},
		{def, "default", 500, retriable}, {def, "default", 501, permanent}, {def, "default", 502, retriable},
		{def, "default", 503, retriable}, {def, "default", 504, retriable}, {def, "default", 599, retriable},
		{retry4xx, "retry_4xx", 400, retriable}, {retry4xx, "retry_4xx", 404, retriable}, {retry4xx, "retry_4xx", 501, permanent},
		{retry4xx, "retry_4xx", 302, permanent},
		{extra, "retry_statuses", 409, retriable}, {extra, "retry_statuses", 501, retriable}, {extra, "retry_statuses", 404, permanent},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.name, tc.code), func(t *testing.T) {
			t.Parallel()
			err := only(tc.sink.Send(context.Background(), []sinks.Message{
				msg(sinksID(), "t", "", "x", map[string]string{"x-want-status": strconv.Itoa(tc.code)}),
			}))
			switch tc.want {
			case ok:
				require.NoError(t, err)
				return
			case retriable:
				require.Error(t, err)
				require.False(t, sinks.IsPermanent(err), "%v", err)
				// A 5xx may say the receiver is down as a whole (Probe
				// tells whether it is).
				require.Equal(t, tc.code >= 500, errors.Is(err, sinks.ErrUnavailable), "%v", err)
			case permanent:
				require.Error(t, err)
				require.True(t, sinks.IsPermanent(err), "%v", err)
			}
			var se *StatusError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.code, se.StatusCode)
			require.Equal(t, fmt.Sprintf("answer %d", tc.code), se.Body)
			require.True(t, strings.HasPrefix(se.Error(), "outbox: http: POST http://127.0.0.1:"), se.Error())
		})
	}
}

var idSeq struct {
	sync.Mutex
	n int
}

// only returns the outcome of the single message of a one-message Send.
func only(err error) error { return sinks.Outcome(err, 0, 1) }

func sinksID() string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", idSeq.n)
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(statusRespond)
	s := newSink(t, Config{URL: rc.URL("/"), MaxRetryAfter: time.Hour})
	capped := newSink(t, Config{URL: rc.URL("/"), MaxRetryAfter: time.Minute})

	send := func(s *Sink, code int, ra string) error {
		return only(s.Send(context.Background(), []sinks.Message{
			msg(sinksID(), "t", "", "x", map[string]string{"x-want-status": strconv.Itoa(code), "x-retry-after": ra}),
		}))
	}

	err := send(s, 503, "7")
	d, ok := sinks.RetryAfter(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, 7*time.Second, d)
	require.False(t, sinks.IsPermanent(err))

	err = send(s, 429, time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))
	d, ok = sinks.RetryAfter(err)
	require.True(t, ok, "%v", err)
	require.InDelta(t, 90*time.Second, d, float64(3*time.Second))

	err = send(capped, 503, "3600")
	d, ok = sinks.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, time.Minute, d, "Retry-After is capped by max_retry_after")

	err = send(s, 503, "soon")
	require.Error(t, err)
	_, ok = sinks.RetryAfter(err)
	require.False(t, ok, "a malformed Retry-After is ignored")

	err = send(s, 400, "30")
	require.True(t, sinks.IsPermanent(err))
	_, ok = sinks.RetryAfter(err)
	require.False(t, ok, "Retry-After means nothing on a permanent failure")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, false},
		{"-5", 0, false},
		{"120", 2 * time.Minute, true},
		{" 5 ", 5 * time.Second, true},
		{"99999999999999999", 10 * time.Minute, true},
		{"Sun, 01 Mar 2026 12:01:00 GMT", time.Minute, true},
		{"Sunday, 01-Mar-26 12:00:30 GMT", 30 * time.Second, true},
		{"Sun Mar  1 12:00:10 2026", 10 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, false},
		{"Sun, 01 Mar 2026 18:00:00 GMT", 10 * time.Minute, true},
		{"1.5", 0, false},
		{"tomorrow", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now, 10*time.Minute)
		require.Equal(t, tc.ok, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, _ []byte) int {
		if r.URL.Path == "/elsewhere" {
			w.WriteHeader(http.StatusOK)
			return http.StatusOK
		}
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		return http.StatusTemporaryRedirect
	})
	s := newSink(t, Config{URL: rc.URL("/hook")})
	err := only(s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}))
	require.True(t, sinks.IsPermanent(err), "%v", err)
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusTemporaryRedirect, se.StatusCode)
	reqs := rc.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, "/hook", reqs[0].Path, "the redirect target must never be requested")
}

func TestErrorBodyIsBoundedAndSanitized(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(func(w http.ResponseWriter, _ *http.Request, _ []byte) int {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("bad\r\nInjected: yes\x00\x1b[31m "))
		_, _ = w.Write([]byte(strings.Repeat("y", 100<<10)))
		return http.StatusBadRequest
	})
	s := newSink(t, Config{URL: rc.URL("/")})
	err := only(s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}))
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.True(t, strings.HasPrefix(se.Body, "bad Injected: yes [31m y"), se.Body)
	require.LessOrEqual(t, len(se.Body), maxErrorBody)
	require.NotContains(t, err.Error(), "\n")
	require.NotContains(t, err.Error(), "\r")
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, _ []byte) int {
		<-r.Context().Done() // never answers; returns when the client gives up
		return 0
	})
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"response_header_timeout", Config{ResponseHeaderTimeout: 200 * time.Millisecond, Timeout: time.Minute}},
		{"timeout", Config{ResponseHeaderTimeout: time.Minute, Timeout: 200 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.URL = rc.URL("/")
			s := newSink(t, tc.cfg)
			start := time.Now()
			err := only(s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}))
			require.Error(t, err)
			// The timeouts are 200ms and the others a minute: 10s tells
			// them apart with room for -race on a loaded machine.
			require.Less(t, time.Since(start), 10*time.Second)
			require.False(t, sinks.IsPermanent(err), "a timeout is retriable: %v", err)
			require.ErrorIs(t, err, sinks.ErrUnavailable, "the request may have arrived: unavailable, not unsent")
			require.NotErrorIs(t, err, sinks.ErrNotAttempted)
			require.Contains(t, strings.ToLower(err.Error()), "timeout")
		})
	}
}

// A refused connection sent nothing: not attempted (the relay counts no
// attempt, and its breaker opens).
func TestConnectionRefusedIsNotSent(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s := newSink(t, Config{URL: "http://" + addr + "/hook?token=s3cr3t-token"})
	err = s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)})
	require.Error(t, err)
	require.False(t, sinks.IsPermanent(err))
	require.ErrorIs(t, only(err), sinks.ErrNotAttempted)
	require.Contains(t, err.Error(), "(not sent)")
	require.Contains(t, err.Error(), "outbox: http: POST http://"+addr+"/…")
	require.NotContains(t, err.Error(), "s3cr3t-token")
}

func TestPerKeyOrderAndConcurrency(t *testing.T) {
	t.Parallel()
	const limit = 4
	rc := newReceiver(t)
	reached := make(chan struct{})
	var once sync.Once
	rc.mu.Lock()
	rc.onArrive = func(cur int) {
		if cur >= limit {
			once.Do(func() { close(reached) })
		}
		// Hold the first wave until the sink has `limit` requests in
		// flight: proves different keys really go concurrently and gives
		// same-key requests every chance to overlap if the sink let them.
		select {
		case <-reached:
		case <-time.After(5 * time.Second):
		}
	}
	rc.mu.Unlock()
	s := newSink(t, Config{URL: rc.URL("/"), MaxConcurrency: limit})

	var batch []sinks.Message
	for i := range 30 {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			batch = append(batch, msg(sinksID(), "t", k, fmt.Sprintf("%s-%03d", k, i), nil))
		}
		if i%3 == 0 {
			batch = append(batch, msg(sinksID(), "t", "", fmt.Sprintf("nokey-%03d", i), nil))
		}
	}
	require.NoError(t, s.Send(context.Background(), batch))

	select {
	case <-reached:
	default:
		t.Fatalf("never had %d requests in flight; max was %d", limit, rc.maxInFlight())
	}
	require.Equal(t, limit, rc.maxInFlight(), "max_concurrency must bound requests per host")
	require.Empty(t, rc.violations())
	last := map[string]string{}
	reqs := rc.requests()
	require.Len(t, reqs, len(batch))
	for _, r := range reqs {
		k := r.Header.Get(HeaderKey)
		if k == "" {
			continue
		}
		require.Greater(t, string(r.Body), last[k], "key %s out of order", k)
		last[k] = string(r.Body)
	}
}

func TestFailureBlocksOnlyItsKey(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	rc.setRespond(func(w http.ResponseWriter, _ *http.Request, body []byte) int {
		code := http.StatusOK
		switch string(body) {
		case "a2":
			code = http.StatusBadRequest
		case "b2":
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		return code
	})
	s := newSink(t, Config{URL: rc.URL("/")})
	batch := []sinks.Message{
		msg(sinksID(), "t", "a", "a1", nil),
		msg(sinksID(), "t", "b", "b1", nil),
		msg(sinksID(), "t", "a", "a2", nil), // 400
		msg(sinksID(), "t", "c", "c1", nil),
		msg(sinksID(), "t", "b", "b2", nil), // 503
		msg(sinksID(), "t", "a", "a3", nil),
		msg(sinksID(), "t", "", "n1", nil),
		msg(sinksID(), "t", "b", "b3", nil),
		msg(sinksID(), "t", "c", "c2", nil),
	}
	err := s.Send(context.Background(), batch)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, len(batch))
	for i, want := range []string{"ok", "ok", "permanent", "ok", "retriable", "skipped", "ok", "skipped", "ok"} {
		e := be.Errs[i]
		switch want {
		case "ok":
			require.NoError(t, e, "index %d", i)
		case "permanent":
			require.True(t, sinks.IsPermanent(e), "index %d: %v", i, e)
		case "retriable":
			require.Error(t, e, "index %d", i)
			require.False(t, sinks.IsPermanent(e), "index %d: %v", i, e)
			require.NotErrorIs(t, e, sinks.ErrNotAttempted)
		case "skipped":
			require.ErrorIs(t, e, sinks.ErrNotAttempted, "index %d", i)
		}
	}
	seen := map[string]bool{}
	for _, r := range rc.requests() {
		seen[string(r.Body)] = true
	}
	require.False(t, seen["a3"], "a3 follows a failed a2 and must not be sent")
	require.False(t, seen["b3"], "b3 follows a failed b2 and must not be sent")
	require.True(t, seen["c2"])
}

func TestBadHeadersArePermanentAndNeverSent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/"), Secrets: []sinkconf.Secret{secretA}})
	for _, tc := range []struct {
		name string
		m    sinks.Message
		want string
	}{
		{"crlf value", msg(sinksID(), "t", "", "x", map[string]string{"x-a": "v\r\nX-Injected: 1"}), "control characters"},
		{"lf value", msg(sinksID(), "t", "", "x", map[string]string{"x-a": "v\nx"}), "control characters"},
		{"nul value", msg(sinksID(), "t", "", "x", map[string]string{"x-a": "v\x00"}), "control characters"},
		{"space in name", msg(sinksID(), "t", "", "x", map[string]string{"x a": "v"}), "not a valid HTTP token"},
		{"colon in name", msg(sinksID(), "t", "", "x", map[string]string{"x:a": "v"}), "not a valid HTTP token"},
		{"crlf in name", msg(sinksID(), "t", "", "x", map[string]string{"x\r\nInjected": "v"}), "not a valid HTTP token"},
		{"empty name", msg(sinksID(), "t", "", "x", map[string]string{"": "v"}), "not a valid HTTP token"},
		{"sink header", msg(sinksID(), "t", "", "x", map[string]string{"Webhook-Signature": "v1,forged"}), "set by the sink"},
		{"framing header", msg(sinksID(), "t", "", "x", map[string]string{"transfer-encoding": "chunked"}), "set by the sink"},
		{"dot in id when signing", msg("a.b", "t", "", "x", nil), "contains '.'"},
		{"crlf in id", msg("a\r\nb", "t", "", "x", nil), "control characters"},
		{"empty id", msg("", "t", "", "x", nil), "empty id"},
	} {
		err := only(s.Send(context.Background(), []sinks.Message{tc.m}))
		require.True(t, sinks.IsPermanent(err), "%s: %v", tc.name, err)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	require.Empty(t, rc.requests())

	// Non-ASCII header values are legal (obs-text) and pass through.
	require.NoError(t, s.Send(context.Background(), []sinks.Message{
		msg(sinksID(), "t", "", "x", map[string]string{"x-name": "Zürich\ttab"}),
	}))
	require.Equal(t, "Zürich\ttab", rc.requests()[0].Header.Get("x-name"))
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	orders, other := newReceiver(t), newReceiver(t)
	cfg := Config{
		Routes: []Route{
			{Topic: "orders.*", URL: orders.URL("/orders")},
			{Topic: "orders.created", URL: other.URL("/never")}, // shadowed: first match wins
			{Topic: "billing.invoice.*", URL: other.URL("/billing")},
		},
	}
	s := newSink(t, cfg)
	err := s.Send(context.Background(), []sinks.Message{
		msg(sinksID(), "orders.created", "", "1", nil),
		msg(sinksID(), "billing.invoice.paid", "", "2", nil),
		msg(sinksID(), "users.created", "", "3", nil),
	})
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.NoError(t, be.Errs[1])
	require.True(t, sinks.IsPermanent(be.Errs[2]), "no route and no default url: %v", be.Errs[2])
	require.ErrorContains(t, be.Errs[2], `no route matches topic "users.created"`)
	require.Len(t, orders.requests(), 1)
	require.Equal(t, "/orders", orders.requests()[0].Path)
	require.Len(t, other.requests(), 1)
	require.Equal(t, "/billing", other.requests()[0].Path)

	cfg.URL = other.URL("/default")
	s2 := newSink(t, cfg)
	require.NoError(t, s2.Send(context.Background(), []sinks.Message{msg(sinksID(), "users.created", "", "4", nil)}))
	require.Equal(t, "/default", other.requests()[1].Path)
}

func TestContextCancellation(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	arrived := make(chan struct{}, 16)
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, _ []byte) int {
		arrived <- struct{}{}
		<-r.Context().Done()
		return 0
	})
	s := newSink(t, Config{URL: rc.URL("/")})

	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := s.Send(ctx, []sinks.Message{msg(sinksID(), "t", "", "x", nil)})
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("in flight", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- s.Send(ctx, []sinks.Message{
				msg(sinksID(), "t", "k", "1", nil),
				msg(sinksID(), "t", "k", "2", nil),
				msg(sinksID(), "t", "", "3", nil),
			})
		}()
		<-arrived
		cancel()
		select {
		case err := <-done:
			var be *sinks.BatchError
			require.ErrorAs(t, err, &be)
			require.ErrorIs(t, be.Errs[0], context.Canceled)
			require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted, "never tried, so no attempt may be counted")
			require.ErrorIs(t, be.Errs[2], context.Canceled)
		case <-time.After(5 * time.Second):
			t.Fatal("Send did not return promptly after its context was cancelled")
		}
	})
}

func TestClose(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	arrived := make(chan struct{}, 1)
	rc.setRespond(func(w http.ResponseWriter, r *http.Request, _ []byte) int {
		arrived <- struct{}{}
		<-r.Context().Done()
		return 0
	})
	s, err := New(Config{URL: rc.URL("/")}, nil)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}) }()
	<-arrived

	// Close waits for the in-flight Send until its ctx ends, then aborts it.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Close(ctx), context.DeadlineExceeded)
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight Send was not aborted by Close")
	}

	require.NoError(t, s.Close(context.Background()), "Close is idempotent")
	require.ErrorIs(t, s.Send(context.Background(), nil), sinks.ErrClosed)
	require.ErrorIs(t, s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}), sinks.ErrClosed)
}

func TestEmptyBatch(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/")})
	require.NoError(t, s.Send(context.Background(), nil))
	require.Empty(t, rc.requests())
}

func TestBlockPrivateNetworks(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	_, port, err := net.SplitHostPort(rc.addr)
	require.NoError(t, err)

	// An IP literal is refused when the config is validated...
	_, err = New(Config{URL: rc.URL("/"), BlockPrivateNetworks: true}, nil)
	require.ErrorContains(t, err, "outbox: http: url: 127.0.0.1 is a non-public address")

	// ...a name is refused at dial time, after resolution, so DNS cannot
	// smuggle an internal address past the check.
	s := newSink(t, Config{URL: "http://localhost:" + port + "/", BlockPrivateNetworks: true})
	err = only(s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}))
	require.ErrorIs(t, err, ErrBlockedAddress)
	require.False(t, sinks.IsPermanent(err))
	require.Empty(t, rc.requests())

	// The same destination is reachable with the guard off.
	open := newSink(t, Config{URL: "http://localhost:" + port + "/"})
	require.NoError(t, open.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "", "x", nil)}))
}

func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	cfg := Config{
		URL:     "https://user:hunter2@hooks.example.com/services/T0/B0/pathtoken?token=querytoken",
		Routes:  []Route{{Topic: "a.*", URL: "https://hooks.example.com/routetoken"}},
		Secrets: []sinkconf.Secret{secretA, secretB},
	}
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "sink", cfg)
	for _, s := range []string{cfg.Redacted(), cfg.String(), fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), logged.String()} {
		for _, secret := range []string{"hunter2", "pathtoken", "querytoken", "routetoken", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "c2Vjb25k"} {
			require.NotContains(t, s, secret)
		}
		require.Contains(t, s, "https://hooks.example.com/…")
		// Issue 34: secrets show as settings, not as the URL's query (they
		// may come from the config file).
		require.Contains(t, s, "https://hooks.example.com/… secret=xxxxx secret=xxxxx")
		require.NotContains(t, s, "?secret")
	}

	bad := cfg
	bad.Secrets = []sinkconf.Secret{"whsec_dG9vc2hvcnQ="}
	err := bad.Validate()
	require.ErrorContains(t, err, "secrets[0]")
	require.NotContains(t, err.Error(), "dG9vc2hvcnQ")
	bad.URL = "http://user:hunter2@example.com/x"
	require.NotContains(t, bad.Validate().Error(), "hunter2")
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string // "" = valid
	}{
		{"https", Config{URL: "https://example.com/hook"}, ""},
		{"loopback http", Config{URL: "http://127.0.0.1:8080/hook"}, ""},
		{"localhost http", Config{URL: "http://localhost:8080/hook"}, ""},
		{"ipv6 loopback http", Config{URL: "http://[::1]:8080/hook"}, ""},
		{"insecure http", Config{URL: "http://example.com/hook"}, "outbox: http: url: http:// to example.com is refused"},
		{"insecure http allowed", Config{URL: "http://example.com/hook", AllowInsecureHTTP: true}, ""},
		{"insecure route", Config{Routes: []Route{{Topic: "a", URL: "http://10.0.0.1/"}}}, "routes[0].url: http:// to 10.0.0.1"},
		{"nothing", Config{}, "url: required"},
		{"routes only", Config{Routes: []Route{{Topic: "a.*", URL: "https://a.example/"}}}, ""},
		{"bad scheme", Config{URL: "ftp://example.com/"}, "url: scheme must be http or https"},
		{"no host", Config{URL: "https:///x"}, "url: host is missing"},
		{"fragment", Config{URL: "https://example.com/#x"}, "url: must not contain a fragment"},
		{"bad pattern", Config{URL: "https://a.example/", Routes: []Route{{Topic: "[", URL: "https://a.example/"}}}, "routes[0].topic: invalid pattern"},
		{"empty pattern", Config{Routes: []Route{{URL: "https://a.example/"}}}, "routes[0].topic: required"},
		{"empty route url", Config{Routes: []Route{{Topic: "a"}}}, "routes[0].url: required"},
		{"secret", Config{URL: "https://a.example/", Secrets: []sinkconf.Secret{secretA, "nope"}}, "secrets[1]: must start with"},
		{"negative timeout", Config{URL: "https://a.example/", Timeout: -1}, "timeout: must not be negative"},
		{"negative dial", Config{URL: "https://a.example/", DialTimeout: -1}, "dial_timeout: must not be negative"},
		{"negative concurrency", Config{URL: "https://a.example/", MaxConcurrency: -1}, "max_concurrency"},
		{"retry status", Config{URL: "https://a.example/", RetryStatuses: []int{404, 302}}, "retry_statuses[1]: 302"},
		{"content type", Config{URL: "https://a.example/", ContentType: "a\nb"}, "content_type"},
		{"block literal", Config{URL: "https://10.0.0.1/", BlockPrivateNetworks: true}, "url: 10.0.0.1 is a non-public address"},
		{"block public literal", Config{URL: "https://8.8.8.8/", BlockPrivateNetworks: true}, ""},
	} {
		err := tc.cfg.Validate()
		if tc.err == "" {
			require.NoError(t, err, tc.name)
			continue
		}
		require.ErrorContains(t, err, tc.err, tc.name)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: http: "), tc.name)
	}
}

func TestNewAppliesDefaults(t *testing.T) {
	t.Parallel()
	s, err := New(Config{URL: "https://example.com/"}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(context.Background())) }()
	require.Equal(t, DefaultTimeout, s.cfg.Timeout)
	require.Equal(t, DefaultResponseHeaderTimeout, s.transport.ResponseHeaderTimeout)
	require.Equal(t, DefaultTLSHandshakeTimeout, s.transport.TLSHandshakeTimeout)
	require.Equal(t, DefaultMaxConcurrency, s.transport.MaxConnsPerHost)
	require.Equal(t, DefaultContentType, s.cfg.ContentType)
	require.Equal(t, DefaultMaxRetryAfter, s.cfg.MaxRetryAfter)
	_, err = New(Config{}, nil)
	require.Error(t, err)
}

func TestRestartRecovers(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t)
	s := newSink(t, Config{URL: rc.URL("/")})
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "k", "1", nil)}))
	require.NoError(t, rc.restart())
	// The pooled connection died with the old server; Idempotency-Key
	// lets net/http redial instead of failing the POST.
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg(sinksID(), "t", "k", "2", nil)}))
	require.Len(t, rc.requests(), 2)
}

func TestSinkErrorsArePrefixed(t *testing.T) {
	t.Parallel()
	var errs []error
	_, err := ParseURL("https://example.com/?bogus=1")
	errs = append(errs, err)
	errs = append(errs, Config{}.Validate())
	for _, err := range errs {
		require.Error(t, err)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: http: "), err.Error())
	}
	require.True(t, errors.Is(fmt.Errorf("x: %w", ErrBlockedAddress), ErrBlockedAddress))
}

// A 5xx that the receiver says is the message's own (Outbox-Failure:
// message) is a plain retriable failure, never a sign of an outage; Probe
// asks the receiver about itself with a HEAD request and reads a 5xx or
// no connection as down, any other answer as up.
func TestFailureHeaderAndProbe(t *testing.T) {
	t.Parallel()
	var health atomic.Int32
	health.Store(http.StatusMethodNotAllowed)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			w.WriteHeader(int(health.Load()))
			return
		}
		w.Header().Set(HeaderFailure, FailureMessage)
		http.Error(w, "out of order", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	s := newSink(t, Config{URL: srv.URL, Timeout: 2 * time.Second})
	m := msg(sinksID(), "t", "k", "x", nil)
	err := only(s.Send(context.Background(), []sinks.Message{m}))
	require.Error(t, err)
	require.False(t, errors.Is(err, sinks.ErrUnavailable), "%v", err)
	require.False(t, sinks.IsPermanent(err), "%v", err)

	require.NoError(t, s.Probe(context.Background(), m), "a 405 to HEAD: the receiver is up")
	health.Store(http.StatusServiceUnavailable)
	require.ErrorContains(t, s.Probe(context.Background(), m), "503")
	srv.Close()
	require.True(t, sinks.IsNotSent(s.Probe(context.Background(), m)), "no connection: down")
}
