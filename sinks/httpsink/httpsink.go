// Package httpsink delivers outbox messages as HTTP webhooks: one POST per
// message, body = payload, signed with the Standard Webhooks scheme
// (webhook-id, webhook-timestamp, webhook-signature). It classifies
// receiver answers into delivered, retriable (with Retry-After honoured)
// and permanent, never follows redirects, and can refuse non-public
// destinations (SSRF guard).
//
// The package uses net/http only. It does not retry by itself: the relay
// persists retry state in the outbox row and calls Send again later, so
// every attempt carries the same webhook-id and a fresh timestamp and
// signature. See docs/sinks/http.md for the operator's view.
package httpsink

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
	"github.com/outbox-relay/outbox-relay/topic"
)

// Headers the sink sets on every request besides the application headers.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
	// HeaderIdempotencyKey repeats the message id. Besides serving
	// receivers that deduplicate on it, its presence lets net/http resend
	// a POST that failed on a stale keep-alive connection before any byte
	// was written, instead of surfacing a spurious failure.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderTopic and HeaderKey carry the outbox topic and key,
	// percent-encoded (RFC 3986, as url.PathEscape) so that any string
	// survives; HeaderKey is absent when the message has no key.
	HeaderTopic = wire.Topic
	HeaderKey   = wire.Key
	// HeaderSeq carries the message's position (sinks.Message.Seq, the
	// outbox row's id) in decimal. A key's messages carry growing
	// positions in the order they were written; consumers (the inbox
	// package) use it to tell a late redelivery from a new message. Like
	// the other headers it is not covered by the Standard Webhooks
	// signature, which signs the id, the timestamp and the body.
	HeaderSeq = wire.Seq
	// UserAgent is sent on every request.
	UserAgent = "outbox-relay"
	// HeaderFailure, on a non-2xx answer, says whose failure it is.
	// FailureMessage ("message") says it is this message's own: the
	// receiver is up and failed on this message (a handler error, an
	// out-of-order message of package inbox's httpinbox). The answer
	// then counts an attempt like any retriable failure, whatever its
	// status, and never reads as the receiver being down.
	HeaderFailure  = "Outbox-Failure"
	FailureMessage = "message"
)

// maxErrorBody is how much of a non-2xx response body goes into the error
// (and from there into the dead-letter table).
const maxErrorBody = 2 << 10

// maxDrain is how much of a response body is read and discarded so the
// connection can be reused; a longer body costs a new connection instead.
const maxDrain = 64 << 10

// bodyReadTimeout bounds reading a response body (the error snippet, the
// drain), from the moment the headers arrived. The status line decides the
// outcome; a receiver that drip-feeds the body after it must not hold the
// Send for the whole request timeout. A body cut short costs the
// connection, nothing else.
const bodyReadTimeout = 500 * time.Millisecond

// reservedHeaders may not be set by the application: the sink owns them,
// or net/http derives them from the request (a value there would be
// ignored or would corrupt the framing).
var reservedHeaders = map[string]bool{
	"webhook-id": true, "webhook-timestamp": true, "webhook-signature": true,
	"idempotency-key": true, wire.Topic: true, wire.Key: true, wire.Seq: true, "user-agent": true,
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "proxy-connection": true, "proxy-authorization": true, "te": true,
	"trailer": true, "upgrade": true, "expect": true,
}

// StatusError is a non-2xx answer from a receiver. Send wraps it with
// sinks.Permanent or, when the receiver sent Retry-After, in a
// *sinks.RetryAfterError; find it with errors.As.
type StatusError struct {
	StatusCode int
	// Target is the destination reduced to scheme://host (see Redacted).
	Target string
	// Body is the start of the response body (at most 2 KiB), with control
	// characters replaced so it is safe to log.
	Body string
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("outbox: http: POST %s: %d %s", e.Target, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// target is one destination URL with its host's concurrency limit.
type target struct {
	raw     string        // the URL as configured (may hold credentials)
	display string        // redacted, for errors and logs
	host    string        // scheme://host:port, without credentials
	sem     chan struct{} // shared by all targets on the same host
	limit   *rate.Limiter // shared likewise; nil: no rate limit
}

type route struct {
	pattern string
	t       *target
}

// Sink posts messages to webhook receivers. It implements sinks.Sink and
// sinks.Prober (a receiver's 5xx may be the message's own). It does not
// implement sinks.HealthChecker on purpose: receivers are often many
// independent third parties, and one of them being down must not make
// the whole relay unready.
type Sink struct {
	cfg       Config
	log       *slog.Logger
	transport *http.Transport
	signer    signer
	routes    []route
	fallback  *target // nil when no default URL
	retry     map[int]bool
	hosts     int // distinct hosts among the destinations
	// now reads the relay host's wall clock. Tests replace it to play a
	// host whose clock is off.
	now func() time.Time

	abort       context.Context // cancelled when Close gives up waiting
	abortCancel context.CancelFunc

	inflight sinks.Inflight
}

var _ sinks.Sink = (*Sink)(nil)

// New validates cfg, applies its defaults and returns a ready sink. It does
// not contact any receiver. A nil logger discards logs.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sink{cfg: cfg, log: logger, retry: map[int]bool{}, now: time.Now}
	for _, code := range cfg.RetryStatuses {
		s.retry[code] = true
	}
	for _, sec := range cfg.Secrets {
		k, err := decodeSecret(string(sec))
		if err != nil { // unreachable after Validate; kept for safety
			return nil, fmt.Errorf("outbox: http: secrets: %w", err)
		}
		s.signer.keys = append(s.signer.keys, k)
	}

	hosts := map[string]*target{} // the shared parts of each host's targets
	mkTarget := func(raw string) *target {
		u, _ := url.Parse(raw) // validated above
		hk := hostKey(u)
		h, ok := hosts[hk]
		if !ok {
			h = &target{sem: make(chan struct{}, cfg.MaxConcurrency)}
			if cfg.RateLimit > 0 {
				h.limit = rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.RateBurst)
			}
			hosts[hk] = h
		}
		return &target{raw: raw, display: redactURL(raw), host: hk, sem: h.sem, limit: h.limit}
	}
	for _, r := range cfg.Routes {
		s.routes = append(s.routes, route{pattern: r.Topic, t: mkTarget(r.URL)})
	}
	if cfg.URL != "" {
		s.fallback = mkTarget(cfg.URL)
	}

	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	if cfg.BlockPrivateNetworks {
		dialer.Control = guardControl
	}
	s.transport = &http.Transport{
		// With block_private_networks a proxy is dialed, and checked,
		// instead of the receiver; see docs/sinks/http.md.
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   cfg.TLSHandshakeTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		// Keep as many idle connections as may be busy, or a burst would
		// close and reopen connections (and redo TLS) all the time.
		MaxIdleConnsPerHost: cfg.MaxConcurrency,
		MaxConnsPerHost:     cfg.MaxConcurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	s.hosts = len(hosts)
	s.abort, s.abortCancel = context.WithCancel(context.Background())
	return s, nil
}

// Send posts each message in its own request. Messages with different keys
// (and messages without a key) go concurrently, bounded per host by
// max_concurrency; messages with the same key go one after the other in
// slice order, and after one fails the later ones are reported with
// sinks.ErrNotAttempted.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.Guard(ctx, msgs, "outbox: http", s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.abort, cancel)
	defer stop()

	// One lane per key in order of first appearance; every keyless
	// message is a lane of its own.
	var lanes [][]int
	byKey := map[string]int{}
	for i, m := range msgs {
		if m.Key == "" {
			lanes = append(lanes, []int{i})
			continue
		}
		if l, ok := byKey[m.Key]; ok {
			lanes[l] = append(lanes[l], i)
			continue
		}
		byKey[m.Key] = len(lanes)
		lanes = append(lanes, []int{i})
	}

	start := time.Now()
	be := sinks.NewBatchError(len(msgs))
	runLane := func(lane []int) {
		// Each lane holds one key, so a gate per lane is the whole
		// ordering rule and needs no locking.
		var gate sinks.KeyGate
		for _, i := range lane {
			m := msgs[i]
			switch {
			case gate.Blocked(m):
				be.Errs[i] = sinks.ErrNotAttempted
			case ctx.Err() != nil:
				be.Errs[i] = fmt.Errorf("%w (outbox: http: %w)", sinks.ErrNotAttempted, ctx.Err())
			default:
				if err := s.post(ctx, m, start); err != nil {
					be.Errs[i] = err
					gate.Fail(m)
					s.log.DebugContext(ctx, "http sink: delivery failed",
						slog.String("id", m.ID), slog.String("topic", m.Topic), slog.Any("error", err))
				}
			}
		}
	}
	if len(lanes) == 1 {
		runLane(lanes[0])
		return be.Err()
	}
	// Workers pull lanes in order. With one host, max_concurrency bounds
	// the requests anyway, so more workers would only park goroutines (and
	// grow their stacks) for nothing: measured 25-30% faster than one
	// goroutine per lane. With several hosts a worker parked on a busy
	// host's limit must not hold back lanes for an idle host, so every
	// lane gets its own worker.
	workers := len(lanes)
	if s.hosts == 1 {
		workers = min(workers, s.cfg.MaxConcurrency)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				l := int(next.Add(1)) - 1
				if l >= len(lanes) {
					return
				}
				runLane(lanes[l])
			}
		})
	}
	wg.Wait()
	return be.Err()
}

// post delivers one message of a Send that began at start and classifies
// the outcome.
func (s *Sink) post(ctx context.Context, m sinks.Message, start time.Time) error {
	t := s.targetFor(m.Topic)
	if t == nil {
		return sinks.Permanent(fmt.Errorf("outbox: http: no route matches topic %q and no default url is configured", m.Topic))
	}
	h, err := s.headers(m)
	if err != nil {
		return sinks.Permanent(err)
	}

	if t.limit != nil {
		if err := t.limit.Wait(ctx); err != nil {
			// Not sent, but not the receiver's doing: no evidence of an
			// outage (see sinks.NotSent).
			return fmt.Errorf("%w (outbox: http: POST %s: waiting for rate_limit: %w)", sinks.ErrNotAttempted, t.display, err)
		}
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("outbox: http: POST %s: %w", t.display, ctx.Err())
	}
	defer func() { <-t.sem }()

	// The timestamp is taken when the request leaves, not when the batch
	// was claimed: receivers reject stale timestamps to stop replays.
	ts := s.sendTime(&m, start).Unix()
	h[http.CanonicalHeaderKey(HeaderWebhookTimestamp)] = []string{strconv.FormatInt(ts, 10)}
	if sig := s.signer.sign(m.ID, ts, m.Payload); sig != "" {
		h[http.CanonicalHeaderKey(HeaderWebhookSignature)] = []string{sig}
	}
	// The request has a context of its own: its deadline is the
	// request's timeout, and cancelling it is the one way to end a body
	// read that has started.
	rctx, cancelReq := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancelReq()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, t.raw, bytes.NewReader(m.Payload))
	if err != nil {
		return sinks.Permanent(fmt.Errorf("outbox: http: POST %s: cannot build request", t.display))
	}
	req.Header = h
	if u := req.URL.User; u != nil {
		// Userinfo is sent as basic auth (what http.Client does).
		pw, _ := u.Password()
		req.SetBasicAuth(u.Username(), pw)
	}

	// The transport, not an http.Client: a client copies every request's
	// headers for the redirects it may follow (never, here: a redirect
	// is a failure, Standard Webhooks) and arms a timer of its own for
	// its timeout. Measured (100k drains into an external receiver,
	// scripts/drain-ab.sh, 8 alternated pairs): faster in 7 pairs, by 3
	// to 8 %, relay CPU −2 to −11 %.
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		return s.transportErr(ctx, rctx, t, err)
	}
	bodyTimer := time.AfterFunc(bodyReadTimeout, cancelReq)
	defer bodyTimer.Stop()
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		_ = resp.Body.Close()
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	_ = resp.Body.Close()
	se := &StatusError{StatusCode: code, Target: t.display, Body: sanitize(snippet)}
	if !s.retriable(code) {
		return sinks.Permanent(se)
	}
	var failed error = se
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now(), s.cfg.MaxRetryAfter); ok {
		failed = &sinks.RetryAfterError{Err: se, After: d}
	}
	if code >= 500 && !strings.EqualFold(resp.Header.Get(HeaderFailure), FailureMessage) {
		// The receiver, or what stands in front of it, may be down, or
		// failed on this message only: Probe tells which (see
		// sinks.Prober).
		return sinks.Unavailable(failed)
	}
	return failed
}

// Destinations implements sinks.Destinations: each host (scheme, host
// and port) the sink posts to is a destination of its own, whose outage
// holds back its messages only.
func (s *Sink) Destinations() int { return s.hosts }

// Destination implements sinks.Destinations: the scheme, host and port m
// is posted to, "" when no route takes it.
func (s *Sink) Destination(m sinks.Message) string {
	if t := s.targetFor(m.Topic); t != nil {
		return t.host
	}
	return ""
}

// Probe implements sinks.Prober: it asks m's receiver whether it is up
// with a HEAD request to m's URL, which carries no message and no
// signature. Any answer below 500 (a 405 from a receiver that takes POST
// only, a 401 for the missing signature) says the receiver is up: a 5xx
// that m got is then m's own. No connection, no answer within the
// timeout, or a 5xx says it is down. The request waits for the host's
// max_concurrency like a message.
func (s *Sink) Probe(ctx context.Context, m sinks.Message) error {
	t := s.targetFor(m.Topic)
	if t == nil {
		return nil // the message fails on its own (no route)
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-t.sem }()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodHead, t.raw, nil)
	if err != nil {
		return fmt.Errorf("outbox: http: HEAD %s: cannot build request", t.display)
	}
	req.Header.Set("User-Agent", UserAgent)
	if u := req.URL.User; u != nil {
		pw, _ := u.Password()
		req.SetBasicAuth(u.Username(), pw)
	}
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		return s.transportErr(ctx, rctx, t, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 500 {
		return &StatusError{StatusCode: resp.StatusCode, Target: t.display}
	}
	return nil
}

// transportErr classifies a request that got no answer (err, from the
// transport; rctx is the request's own context, ctx the Send's): not sent
// when no connection was made, unavailable when the connection broke or
// the answer did not come in time, as is when the Send itself ended.
func (s *Sink) transportErr(ctx, rctx context.Context, t *target, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("outbox: http: POST %s: %w", t.display, cerr)
	}
	if errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return sinks.Unavailable(fmt.Errorf("outbox: http: POST %s: no answer within the timeout (%s): %w", t.display, s.cfg.Timeout, err))
	}
	// url.Error repeats the full URL, which may hold a token; keep
	// only the cause.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	err = fmt.Errorf("outbox: http: POST %s: %w", t.display, err)
	switch {
	case errors.Is(err, ErrBlockedAddress):
		// The name resolved to a non-public address: it may resolve
		// to a public one again, and the message gets its attempts
		// before the dead-letter table.
		return err
	case sinks.Unreached(err) || isTLSFailure(err):
		// No connection, so no request: the receiver got nothing.
		return sinks.NotSent(err)
	}
	// The connection broke with the request on it: the receiver may
	// have it.
	return sinks.Unavailable(err)
}

// isTLSFailure reports whether err is a failed TLS handshake: a
// certificate the sink does not trust, a server that does not speak TLS.
// The request was never written.
func isTLSFailure(err error) bool {
	var ve *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var ae tls.AlertError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &ve) || errors.As(err, &rh) || errors.As(err, &ae) ||
		errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// sendTime is the best estimate of the current time for m, in a Send that
// began at start: the database's clock at claim plus the time elapsed
// since (a monotonic reading, immune to the host's clock being off or
// stepped). Only a message without ClaimedAt (a caller other than the
// relay) gets the host's clock.
func (s *Sink) sendTime(m *sinks.Message, start time.Time) time.Time {
	if m.ClaimedAt.IsZero() {
		return s.now()
	}
	return m.ClaimedAt.Add(time.Since(start))
}

// retriable classifies a non-2xx status: 408, 425, 429 and 5xx other than
// 501 are worth retrying; 3xx (redirects are not followed), 501 and the
// other 4xx mean this message will never be accepted. Codes outside
// 300-599 come from a misbehaving receiver and are retried.
func (s *Sink) retriable(code int) bool {
	switch {
	case s.retry[code]:
		return true
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return true
	case code >= 400 && code <= 499:
		return s.cfg.Retry4xx
	case code == http.StatusNotImplemented:
		return false
	case code >= 300 && code <= 399:
		return false
	default:
		return true
	}
}

// targetFor returns the destination of topic, nil when nothing matches.
func (s *Sink) targetFor(t string) *target {
	for _, r := range s.routes {
		if topic.Match(r.pattern, t) {
			return r.t
		}
	}
	return s.fallback
}

// headers builds the request headers of m except the timestamp and
// signature. An application header that is not a valid HTTP field, or that
// collides with one the sink or net/http owns, fails the message: sending
// it would either inject extra header lines or silently drop data.
func (s *Sink) headers(m sinks.Message) (http.Header, error) {
	if m.ID == "" {
		return nil, errors.New("outbox: http: message has an empty id")
	}
	if !validHeaderValue(m.ID) {
		return nil, errors.New("outbox: http: message id contains control characters")
	}
	if len(s.signer.keys) > 0 && strings.Contains(m.ID, ".") {
		// Standard Webhooks signs "id.timestamp.body"; a dot in the id
		// would make that string ambiguous.
		return nil, fmt.Errorf("outbox: http: message id %q contains '.', which Standard Webhooks signing forbids", m.ID)
	}
	h := make(http.Header, len(m.Headers)+8)
	for name, v := range m.Headers {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("outbox: http: header name %q is not a valid HTTP token", name)
		}
		if reservedHeaders[strings.ToLower(name)] {
			return nil, fmt.Errorf("outbox: http: header %q is set by the sink or by HTTP itself and may not come from the message", name)
		}
		if !validHeaderValue(v) {
			return nil, fmt.Errorf("outbox: http: header %q has a value with control characters (CR, LF, NUL...)", name)
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		h[k] = append(h[k], v)
	}
	if len(h["Content-Type"]) == 0 {
		h["Content-Type"] = []string{s.cfg.ContentType}
	}
	h["User-Agent"] = []string{UserAgent}
	h[http.CanonicalHeaderKey(HeaderWebhookID)] = []string{m.ID}
	h[HeaderIdempotencyKey] = []string{m.ID}
	h[http.CanonicalHeaderKey(HeaderTopic)] = []string{url.PathEscape(m.Topic)}
	h[http.CanonicalHeaderKey(HeaderSeq)] = []string{strconv.FormatInt(m.Seq, 10)}
	if m.Key != "" {
		h[http.CanonicalHeaderKey(HeaderKey)] = []string{url.PathEscape(m.Key)}
	}
	return h, nil
}

// Close stops new Sends, waits for in-flight ones until ctx ends (then
// aborts them) and closes idle connections. It is idempotent.
// KeySerial reports that a key's messages are posted one request after
// another, different keys concurrently (sinks.KeySerial).
func (s *Sink) KeySerial() bool { return true }

func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	if err != nil {
		err = fmt.Errorf("outbox: http: close: %w", err)
	}
	// Nothing may still be running after Close returns on time, and what
	// is still running after ctx ended must stop now.
	s.abortCancel()
	s.transport.CloseIdleConnections()
	return err
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP-date,
// capped at max. It reports false for a missing, malformed or past value.
func parseRetryAfter(v string, now time.Time, max time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0, false
		}
		if n > int64(max/time.Second) {
			return max, true
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
		if d <= 0 {
			return 0, false
		}
	} else {
		return 0, false
	}
	return min(d, max), true
}

// sanitize makes a response body snippet safe for one log line: invalid
// UTF-8 and control characters become spaces, runs of spaces collapse.
func sanitize(b []byte) string {
	var sb strings.Builder
	space := false
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		b = b[n:]
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			if !space && sb.Len() > 0 {
				sb.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		sb.WriteRune(r)
	}
	return strings.TrimRight(sb.String(), " ")
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue rejects control characters other than horizontal tab;
// CR and LF are what header injection needs.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
