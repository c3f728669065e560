// Package httpinbox receives the relay's webhooks through the inbox: Handler
// verifies the Standard Webhooks signature first, then runs the handler in
// a database transaction with the inbox, and answers 2xx only after that
// transaction committed.
//
// The relay retries every answer but 2xx (and dead-letters 4xx other than
// 408, 425 and 429), holding back the later messages of the key while it
// retries; a 5xx without Outbox-Failure: message may mean the receiver is
// down, which the relay asks it (HEAD) before it counts an attempt. So
// Handler answers:
//
//	processed, or a duplicate            204
//	out of order, or the handler failed  500, Outbox-Failure: message, Retry-After: 1
//	bad or missing signature             401
//	outbox-key or outbox-seq malformed   400
//	body over MaxBody                    413
//	the body could not be read           503
//
// The 500 is that message's own failure: the relay retries it on its
// backoff and dead-letters it after its attempts, never reading it as the
// receiver being down. It is not a 4xx, which the relay dead-letters at
// once: an out-of-order message may pass on a later attempt, once
// somebody acts (ApplyOutOfOrder, a replay in order). The 401, 400 and
// 413 are what no retry can fix. The 503 is the request itself breaking
// (the connection), not the message.
//
// Positions are compared per producer: the relay names its outbox in the
// outbox-producer header, which Message reads into inbox.Message.Producer.
package httpinbox

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The request headers the relay's webhook sink sets (sinks/httpsink).
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
	HeaderKey              = wire.Key
	HeaderSeq              = wire.Seq
	// HeaderProducer names the outbox the message comes from
	// (inbox.HeaderProducer): positions are compared per producer.
	HeaderProducer = inbox.HeaderProducer
	// HeaderFailure with FailureMessage, on an answer, tells the relay's
	// webhook sink that the failure is this message's own (its
	// httpsink.HeaderFailure): retried with backoff and dead-lettered
	// after its attempts, never read as the receiver being down.
	HeaderFailure  = "Outbox-Failure"
	FailureMessage = "message"
)

// Errors of Verify and Message.
var (
	ErrSignature = errors.New("outbox: httpinbox: signature does not verify")
	ErrHeaders   = errors.New("outbox: httpinbox: request lacks the relay's headers")
)

// Verifier checks Standard Webhooks signatures.
type Verifier struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

// DefaultTolerance is how far webhook-timestamp may be from the receiver's
// clock (the Standard Webhooks recommendation), against replays.
const DefaultTolerance = 5 * time.Minute

// NewVerifier returns a Verifier for the relay's secrets ("whsec_" and the
// base64 key; several while rotating: a signature made with any of them
// verifies). tolerance 0 means DefaultTolerance.
func NewVerifier(secrets []string, tolerance time.Duration) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("outbox: httpinbox: secrets: at least one is required")
	}
	v := &Verifier{tolerance: tolerance, now: time.Now}
	if v.tolerance <= 0 {
		v.tolerance = DefaultTolerance
	}
	for i, s := range secrets {
		b64, ok := strings.CutPrefix(s, "whsec_")
		if !ok {
			return nil, fmt.Errorf("outbox: httpinbox: secrets[%d]: must start with \"whsec_\"", i)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			key, err = base64.RawStdEncoding.DecodeString(b64)
		}
		if err != nil {
			return nil, fmt.Errorf("outbox: httpinbox: secrets[%d]: the part after \"whsec_\" is not valid base64", i)
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// Verify checks the signature of a request with headers h and body: one
// of the space-separated "v1,<base64>" signatures must be the HMAC-SHA256
// of "id.timestamp.body" under one of the secrets, and the timestamp
// within the tolerance of the receiver's clock.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id, ts, sigs := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp), h.Get(HeaderWebhookSignature)
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: missing webhook-id, webhook-timestamp or webhook-signature", ErrSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: webhook-timestamp %q is not a number", ErrSignature, ts)
	}
	if d := v.now().Sub(time.Unix(sec, 0)); d > v.tolerance || d < -v.tolerance {
		return fmt.Errorf("%w: webhook-timestamp is %s away from this clock", ErrSignature, d.Round(time.Second))
	}
	for _, key := range v.keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		want := mac.Sum(nil)
		for _, s := range strings.Fields(sigs) {
			ver, b64, ok := strings.Cut(s, ",")
			if !ok || ver != "v1" {
				continue
			}
			if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrSignature
}

// Message returns the inbox message of a request's headers: id from
// webhook-id, key from outbox-key (percent-decoded), position from
// outbox-seq (0 when absent), producer from outbox-producer ("" when
// absent).
func Message(h http.Header) (inbox.Message, error) {
	m := inbox.Message{ID: h.Get(HeaderWebhookID), Producer: h.Get(HeaderProducer)}
	if m.ID == "" {
		return m, fmt.Errorf("%w: no webhook-id", ErrHeaders)
	}
	if k := h.Get(HeaderKey); k != "" {
		key, err := url.PathUnescape(k)
		if err != nil {
			return m, fmt.Errorf("%w: outbox-key %q: %v", ErrHeaders, k, err)
		}
		m.Key = key
	}
	if s := h.Get(HeaderSeq); s != "" {
		seq, err := strconv.ParseInt(s, 10, 64)
		if err != nil || seq < 0 {
			return m, fmt.Errorf("%w: outbox-seq %q is not a position", ErrHeaders, s)
		}
		m.Seq = seq
	}
	return m, nil
}

// Request is one verified webhook as the handler sees it.
type Request struct {
	Message inbox.Message
	Header  http.Header
	Body    []byte
}

// Handler is an http.Handler for the relay's webhooks.
type Handler struct {
	// Verifier checks signatures. Required (a receiver that does not
	// check them lets anybody apply effects).
	Verifier *Verifier
	// Inbox records the processed messages. Required.
	Inbox *inbox.Inbox
	// DB begins the transactions (a *pgxpool.Pool). Required.
	DB inbox.Beginner
	// Handle applies a webhook's effects through tx. It does not run for
	// a duplicate. Required.
	Handle func(ctx context.Context, tx pgx.Tx, r *Request) error
	// MaxBody bounds the request body. Default 16 MiB (the outbox's
	// default payload limit).
	MaxBody int64
	// Logger logs refused and failed requests (never bodies). Default
	// slog.Default().
	Logger *slog.Logger
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.Logger
	if log == nil {
		log = slog.Default()
	}
	if h.Verifier == nil || h.Inbox == nil || h.DB == nil || h.Handle == nil {
		log.Error("httpinbox: Handler: Verifier, Inbox, DB and Handle are required")
		http.Error(w, "receiver misconfigured", http.StatusInternalServerError)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	limit := h.MaxBody
	if limit <= 0 {
		limit = 16 << 20
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body failed", http.StatusServiceUnavailable)
		return
	}
	if err := h.Verifier.Verify(r.Header, body); err != nil {
		log.Warn("webhook refused", "id", r.Header.Get(HeaderWebhookID), "err", err)
		http.Error(w, "signature does not verify", http.StatusUnauthorized)
		return
	}
	m, err := Message(r.Header)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := &Request{Message: m, Header: r.Header, Body: body}
	_, err = h.Inbox.Run(r.Context(), h.DB, m, func(ctx context.Context, tx pgx.Tx) error { return h.Handle(ctx, tx, req) })
	if err != nil {
		// Retriable for the relay, which holds the key's later messages
		// meanwhile; an out-of-order message stays that way until
		// somebody acts, and the relay dead-letters it after its
		// attempts, where an operator sees it.
		log.Warn("webhook not processed", "id", m.ID, "key", m.Key, "seq", m.Seq, "err", err)
		w.Header().Set("Retry-After", "1")
		w.Header().Set(HeaderFailure, FailureMessage)
		http.Error(w, "not processed", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
