// Package sinks defines the contract between the relay engine and the
// systems it publishes to (Kafka, RabbitMQ, HTTP webhooks, stdout, ...).
//
// Each backend lives in its own sub-package (sinks/kafkasink,
// sinks/amqpsink, sinks/httpsink, sinks/stdout, ...) and must pass the
// shared conformance suite in sinks/sinktest against a real backend. Each
// also exports a Driver (driver.go) that tells programs how to open it from
// a URL, and what to call it in metrics, traces and formats; sinks/builtin
// lists the shipped drivers, sinks/sinkconf holds the configuration pieces
// they share. This package has no broker dependencies.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Message is one outbox row as a sink sees it.
type Message struct {
	// ID is the stable message id (a UUID). It is the same on every attempt
	// and after a dead-letter replay; consumers deduplicate on it.
	ID string
	// Seq is the row's position in the outbox (the bigint primary key).
	// Messages that share a key are published in Seq order.
	Seq int64
	// Topic is the logical destination written by the application.
	Topic string
	// Key orders and partitions messages. Empty means the message had no key
	// (NULL in the table) and is not ordered relative to anything.
	Key string
	// Payload is delivered byte for byte.
	Payload []byte
	// Headers are the string headers written by the application, plus
	// the relay's HeaderProducer. A sink, a format or a hook reads them
	// and never writes them: messages may share one map (a format that
	// adds headers copies it first).
	Headers map[string]string
	// CreatedAt is the database time of the writing transaction.
	CreatedAt time.Time
	// ClaimedAt is the database's clock when the relay claimed the message
	// (now() of the claim transaction); zero when the caller does not know
	// it. A sink that must put the current time on the wire (a webhook's
	// send timestamp) uses ClaimedAt plus the time elapsed since its Send
	// began, not the relay host's wall clock: that clock may be off, and
	// receivers and brokers refuse times too far from theirs.
	ClaimedAt time.Time
	// Attempt counts deliveries tried so far, this one included (1 on the
	// first try).
	Attempt int
}

// Sink publishes messages to one backend.
//
// Send returns nil only when every message in msgs has been durably accepted
// by the backend (Kafka acks=all, AMQP publisher confirm of a routed
// message, HTTP 2xx). When some messages fail it returns a *BatchError whose
// i-th entry belongs to msgs[i]; any other non-nil error means no message may
// be assumed delivered.
//
// Ordering: messages with the same non-empty Key must reach the backend in
// slice order, never concurrently, and once one of them fails no later
// message with that Key may be delivered in the same call: the sink reports
// those later messages with ErrNotAttempted (wrapped or bare). Messages with
// different keys may be published concurrently.
//
// Errors the relay must not retry (the message can never be accepted: too
// large, unroutable, rejected as malformed) are wrapped with Permanent.
//
// Outages: a failure that says the destination as a whole is down is
// reported as such, not as a failure of the message. Mark it NotSent
// when nothing of the message left the relay (the connection was
// refused, the name does not resolve, no connection came before ctx
// ended, the broker blocks every publisher), and wrap it with Unavailable
// when the message went out without an answer (a connection lost with
// it on the wire, a timeout) or the destination answered that it is
// unavailable as a whole (HTTP 503, a broker without a leader or
// quorum). A plain retriable error says "this message failed": the relay
// counts an attempt for it. sinktest's Outage feature checks the
// classification against the real destination taken down.
//
// Send is safe for concurrent use; after Close it returns ErrClosed. Close is
// idempotent and waits for in-flight Sends to finish or ctx to end.
type Sink interface {
	Send(ctx context.Context, msgs []Message) error
	Close(ctx context.Context) error
}

// HealthChecker is implemented by sinks that can tell whether their backend
// is reachable right now. The relay uses it for readiness.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}

// Prober is implemented by sinks whose "unavailable" answers (see
// ErrUnavailable) may follow the message rather than the destination: a
// webhook receiver answers 5xx, or no answer in time, to a message its
// own code fails on, while it takes every other message. Before it reads
// such answers as an outage, the relay asks Probe about the destination
// of one of the messages that got them: a request that carries no
// message. Probe returns nil when the destination answered as a service
// that is up (whatever it said of a request without a message), and an
// error when it is down too (no connection, no answer in time, a 5xx):
// only then are the failures read as an outage that counts no attempt.
// With nil they are the messages' own failures: each counts an attempt
// and is dead-lettered when its attempts run out. A sink without Prober
// has its ErrUnavailable answers read as the destination's (a broker
// without a leader says nothing about the message).
type Prober interface {
	Probe(ctx context.Context, m Message) error
}

// Destinations is implemented by sinks that deliver to several
// destinations which fail independently (a webhook sink's hosts). When
// there is more than one, the relay keeps an outage state for each
// instead of one for the route: a destination found down (see
// ErrUnavailable) holds back its own messages, which count no attempt
// and wait for its probes, while the others deliver; a Retry-After that
// every message to a destination got pauses that destination only.
type Destinations interface {
	// Destinations is how many destinations the sink delivers to.
	Destinations() int
	// Destination names m's destination as logs and status show it (no
	// credentials); "" when m has none (it fails on its own).
	Destination(m Message) string
}

// StartChecker is implemented by sinks that can tell at start-up that their
// configuration will not work, for a reason waiting cannot fix (the broker
// refuses the credentials). CheckStart waits until the sink is connected,
// until its connection fails for a reason that may pass (it returns nil
// then: the relay runs and the sink reconnects), or until ctx ends; it
// returns an error when the refusal lasted until ctx ended. The relay
// calls it at start-up with its ConnectTimeout, as it waits for the
// database.
type StartChecker interface {
	CheckStart(ctx context.Context) error
}

// KeySerial is implemented by sinks that send a key's messages one round
// trip after another (a publisher-confirm round, a webhook request, a
// strict NATS round for each message of a key) while different keys go in
// parallel. Such a sink is faster the more keys a batch spans, so the relay
// claims its batches across more lanes: at most an eighth of a batch from
// one lane per claim. KeySerial reports whether this sink, as configured,
// works that way.
type KeySerial interface {
	KeySerial() bool
}

// BatchLanes is implemented by a KeySerial sink whose batches should be
// spread wider than the relay's default: drawn from at least BatchLanes()
// lanes when the backlog allows (at most that fraction of a batch from one
// lane per claim). 0 keeps the default (8).
type BatchLanes interface {
	BatchLanes() int
}

// Wrapper is implemented by sinks that wrap another one (a payload
// format): Unwrap returns the wrapped sink, so that the relay finds the
// capabilities of the sink underneath.
type Wrapper interface {
	Unwrap() Sink
}

// IsKeySerial reports whether s, or a sink it wraps, is a KeySerial sink
// that says so.
func IsKeySerial(s Sink) bool {
	k, ok := As[KeySerial](s)
	return ok && k.KeySerial()
}

// As returns s, or the first sink it wraps (through Wrapper) that
// implements T: how the relay finds a sink's optional interfaces
// (StartChecker, KeySerial, BatchLanes) under a payload format.
func As[T any](s Sink) (T, bool) {
	for s != nil {
		if t, ok := s.(T); ok {
			return t, true
		}
		w, ok := s.(Wrapper)
		if !ok {
			break
		}
		s = w.Unwrap()
	}
	var zero T
	return zero, false
}

var (
	// ErrClosed is returned by Send after Close.
	ErrClosed = errors.New("outbox: sink closed")
	// ErrNotAttempted marks a message the sink did not try to deliver because
	// an earlier message with the same key failed in the same batch. The
	// relay leaves such messages untouched: no attempt is counted.
	//
	// A sink may also report it, wrapped with the cause, for a message it
	// could not even start sending (the backend refused the connection):
	// such a message was certainly not delivered, and the relay leaves it
	// untouched rather than counting an attempt and storing a backoff in
	// its row. When no message of a batch was attempted, the relay's worker
	// backs off before claiming again, so an unreachable backend costs no
	// attempts and its backlog goes out at the worker's next try once it is
	// back.
	ErrNotAttempted = errors.New("outbox: not attempted: an earlier message with the same key failed")
	// ErrUnavailable marks a failure that says the destination as a whole
	// is unavailable, not that this message is wrong: the receiver
	// answered 502, 503 or 504, the request timed out or its connection
	// was reset, the broker said it has no leader or is shutting down. It
	// is retriable, and the message may have arrived (a timeout).
	//
	// When nothing of a batch got through and nothing failed on its own,
	// and the failures say the destination is down (a message not sent,
	// see NotSent; ErrUnavailable across two keys or more, or, for a
	// sink that is a Prober, ErrUnavailable that its Probe confirms), the
	// relay counts no attempt: it leaves the batch untouched and opens
	// the route's outage breaker, which claims one message at a time, as
	// a probe, on a short backoff until one gets through. Otherwise the
	// error counts an attempt like any retriable one. Wrap it with
	// Unavailable.
	ErrUnavailable = errors.New("outbox: destination unavailable")
)

// Unavailable marks err as saying the destination as a whole is
// unavailable (see ErrUnavailable): errors.Is(Unavailable(err),
// ErrUnavailable) and errors.Is(…, err) both hold. Unavailable(nil) is
// nil.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return &unavailableError{err}
}

// NotSent marks err as a failure after which nothing of the message
// reached the destination (a refused connection, an unresolvable host, a
// failed TLS handshake): errors.Is(NotSent(err), ErrNotAttempted) holds,
// so the relay counts no attempt (see ErrNotAttempted), and its text is
// err's with " (not sent)". NotSent(nil) is nil.
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err}
}

// Unreached reports whether err says no connection to the destination
// could be made (a failed dial: refused, no route, the dial timed out; a
// name that does not resolve): nothing was sent.
func Unreached(err error) bool {
	var oe *net.OpError
	var dns *net.DNSError
	return errors.As(err, &oe) && oe.Op == "dial" || errors.As(err, &dns)
}

// IsNotSent reports whether err, or an error it wraps, was marked by
// NotSent.
func IsNotSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns)
}

type notSentError struct{ err error }

func (e *notSentError) Error() string   { return e.err.Error() + " (not sent)" }
func (e *notSentError) Unwrap() []error { return []error{e.err, ErrNotAttempted} }

type unavailableError struct{ err error }

func (e *unavailableError) Error() string   { return e.err.Error() }
func (e *unavailableError) Unwrap() []error { return []error{e.err, ErrUnavailable} }

// PermanentError marks a failure that retrying cannot fix. The relay moves
// the message to the dead-letter table at once, with Reason.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that IsPermanent reports true. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return err
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or any error it wraps, is permanent.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// RetryAfterError asks the relay not to retry before After has elapsed (an
// HTTP Retry-After, a broker throttle hint). The relay uses the larger of
// After and its own backoff delay.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.After)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns the delay requested by err, if any.
func RetryAfter(err error) (time.Duration, bool) {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra.After, true
	}
	return 0, false
}

// BatchError reports per-message outcomes of a Send. Errs has one entry per
// message sent; a nil entry means that message was delivered.
type BatchError struct {
	Errs []error
}

// NewBatchError returns a BatchError sized for n messages, all successful.
func NewBatchError(n int) *BatchError { return &BatchError{Errs: make([]error, n)} }

// Failed reports how many entries are non-nil.
func (e *BatchError) Failed() int {
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	return n
}

// Err returns e when at least one message failed, else nil. Sinks end Send
// with `return be.Err()`.
func (e *BatchError) Err() error {
	if e == nil || e.Failed() == 0 {
		return nil
	}
	return e
}

func (e *BatchError) Error() string {
	var first error
	for _, err := range e.Errs {
		if err != nil && !errors.Is(err, ErrNotAttempted) {
			first = err
			break
		}
	}
	if first == nil {
		for _, err := range e.Errs {
			if err != nil {
				first = err
				break
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "outbox: %d of %d messages failed", e.Failed(), len(e.Errs))
	if first != nil {
		b.WriteString(": ")
		b.WriteString(first.Error())
	}
	return b.String()
}

// Outcome returns the error for message i of a batch of n given the error
// Send returned: nil when delivered. A non-BatchError error (or a BatchError
// of the wrong length) applies to every message.
func Outcome(sendErr error, i, n int) error {
	if sendErr == nil {
		return nil
	}
	var be *BatchError
	if errors.As(sendErr, &be) && len(be.Errs) == n {
		return be.Errs[i]
	}
	return sendErr
}

// KeyGate enforces the ordering rule for sinks that send messages one at a
// time: a message is blocked (report ErrNotAttempted for it) when an earlier
// message with the same non-empty key already failed. The zero value is
// ready; it is not safe for concurrent use.
type KeyGate struct {
	failed map[string]bool
}

// Blocked reports whether m must be skipped because an earlier message with
// its key failed.
func (g *KeyGate) Blocked(m Message) bool {
	return m.Key != "" && g.failed[m.Key]
}

// Fail records that m failed, blocking later messages with its key.
func (g *KeyGate) Fail(m Message) {
	if m.Key == "" {
		return
	}
	if g.failed == nil {
		g.failed = make(map[string]bool)
	}
	g.failed[m.Key] = true
}
