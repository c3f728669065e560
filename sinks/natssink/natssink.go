// Package natssink publishes outbox messages to NATS JetStream.
//
// Each message is published to a subject (the topic, or a template) with
// the header Nats-Msg-Id set to the message id, so that a message the
// relay publishes again after a crash, inside the stream's duplicate
// window, is dropped by the server: a stream holds each message once.
// Publishes are asynchronous, their acks pipelined; Send returns once
// every ack (or failure) is in.
//
// Per-key order (ordering=strict, the default). A batch is sent in
// rounds: round r holds the r-th message of every key (and, in round 0,
// every message without a key), so message n of a key is published only
// once message n-1 was stored. A later message of a key is thus never
// stored before an earlier one that failed (a full stream with discard
// new, a leader election, a timeout); keys still travel together, so a
// batch of many keys costs few round trips, and one hot key costs one
// round trip per message. ordering=pipelined publishes the whole batch at
// once instead (see Config.Ordering for what it gives up).
//
// The sink keeps one connection, which nats.go reconnects forever with
// backoff. It never buffers while disconnected: a Send waits for the
// connection (up to its deadline) and reports what it could not send as
// sinks.ErrNotAttempted.
package natssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrNoStream is wrapped by the (permanent) error of a message whose
	// subject no stream covers.
	ErrNoStream = errors.New("outbox: nats: no stream")
	// ErrTooLarge is wrapped by the (permanent) error of a message larger
	// than the server's max_payload or the stream's max_msg_size.
	ErrTooLarge = errors.New("outbox: nats: message too large")
	// ErrNotConnected is wrapped by the error of a Send that found no
	// connection within its deadline.
	ErrNotConnected = errors.New("outbox: nats: not connected")
	// ErrNoAck is wrapped by the error of a message whose ack did not come
	// (timeout, disconnect). It may have been stored; a resend inside the
	// duplicate window is dropped by the server.
	ErrNoAck = errors.New("outbox: nats: no ack")
)

// JetStream API error codes the sink tells apart.
const (
	codeMessageTooLarge = 10054 // message size exceeds maximum allowed
	codeStreamMismatch  = 10060 // expected stream does not match
)

// Sink publishes to NATS JetStream. It implements sinks.Sink and
// sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	subject  sinkconf.Template
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	inflight sinks.Inflight
	closing  *atomic.Bool // set by Close: disconnects are no news then
	// connClosed is closed by nats.go's closed callback, the last one it
	// dispatches: Close waits for it so that no callback (and no log line)
	// comes after Close returns.
	connClosed chan struct{}
	// streamReady is closed once create_stream made (or found) the
	// stream; nil without create_stream. Send waits for it: a publish
	// before would find no stream and dead-letter its messages.
	streamReady chan struct{}
	stopCreate  context.CancelFunc // ends createStream's retries on Close
	createDone  chan struct{}      // closed when createStream returns
}

// New returns a sink for cfg. It validates cfg, applies the defaults and
// starts connecting in the background: New does not fail when the server
// is down (Send waits for the connection, Healthy reports it). With
// create_stream it creates the stream once connected. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	subject, err := sinkconf.ParseTemplate(cfg.Subject)
	if err != nil {
		return nil, fmt.Errorf("outbox: nats: subject: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With("sink", "nats")
	connClosed := make(chan struct{})
	closing := new(atomic.Bool)
	srv, err := servers(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("outbox: nats: url: %w", err)
	}
	u, _ := url.Parse(cfg.URL)
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(cfg.DialTimeout),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		// Nothing is buffered while disconnected: a publish then fails at
		// once and the message is reported not attempted.
		nats.ReconnectBufSize(-1),
		nats.CustomReconnectDelay(reconnectDelay(cfg.ReconnectInitial, cfg.ReconnectMax)),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if !closing.Load() {
				log.Warn("nats disconnected; reconnecting", "err", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(connClosed) }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("nats connected", "server", nc.ConnectedUrlRedacted())
		}),
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			opts = append(opts, nats.UserInfo(u.User.Username(), p))
		} else {
			opts = append(opts, nats.Token(u.User.Username()))
		}
	}
	switch {
	case cfg.Token != "":
		opts = append(opts, nats.Token(string(cfg.Token)))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: nats: nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(strings.Join(srv, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: nats: connect: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("outbox: nats: %w", err)
	}
	s := &Sink{cfg: cfg, subject: subject, nc: nc, js: js, log: log, closing: closing, connClosed: connClosed,
		stopCreate: func() {}}
	if cfg.CreateStream {
		s.streamReady = make(chan struct{})
		ctx, stop := context.WithCancel(context.Background())
		s.stopCreate = stop
		s.createDone = make(chan struct{})
		go s.createStream(ctx)
	}
	return s, nil
}

// createStream creates the configured stream once connected, unless it
// exists, then closes streamReady. It tries until it succeeds or stop
// ends.
func (s *Sink) createStream(stop context.Context) {
	defer close(s.createDone)
	for {
		ctx, cancel := context.WithTimeout(stop, s.cfg.DialTimeout)
		err := s.waitConnected(ctx)
		if err == nil {
			_, err = s.js.Stream(ctx, s.cfg.Stream)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				var subjects []string
				for _, sub := range strings.Split(s.cfg.StreamSubjects, ",") {
					if sub = strings.TrimSpace(sub); sub != "" {
						subjects = append(subjects, sub)
					}
				}
				_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
					Name:       s.cfg.Stream,
					Subjects:   subjects,
					Duplicates: s.cfg.DuplicateWindow,
					Storage:    jetstream.FileStorage,
				})
				if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
					s.log.Info("nats stream created", "stream", s.cfg.Stream, "subjects", subjects)
					err = nil
				}
			}
		}
		cancel()
		if err == nil {
			close(s.streamReady)
			return
		}
		if stop.Err() != nil {
			return
		}
		s.log.Warn("nats create_stream failed; trying again", "stream", s.cfg.Stream, "err", err)
		select {
		case <-stop.Done():
			return
		case <-time.After(s.cfg.ReconnectMax):
		}
	}
}

func reconnectDelay(initial, maxDelay time.Duration) nats.ReconnectDelayHandler {
	return func(attempts int) time.Duration {
		d := initial
		for i := 1; i < attempts && d < maxDelay; i++ {
			d *= 2
		}
		d = min(d, maxDelay)
		// ±20 % jitter, so that relays restarted together do not dial in
		// step.
		return d - d/5 + rand.N(2*d/5+1)
	}
}

// Healthy reports whether the sink is connected.
func (s *Sink) Healthy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: nats: %w", err)
	}
	switch st := s.nc.Status(); st {
	case nats.CONNECTED:
		return nil
	case nats.CLOSED:
		return sinks.ErrClosed
	default:
		return fmt.Errorf("%w: %s (last error: %v)", ErrNotConnected, st, s.nc.LastError())
	}
}

// Close refuses new Sends, waits for in-flight ones or ctx, then closes
// the connection. It is idempotent.
// KeySerial reports whether the batch goes out in rounds per key
// (ordering=strict; sinks.KeySerial): pipelined puts it all in flight.
func (s *Sink) KeySerial() bool { return s.cfg.Ordering != OrderingPipelined }

func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	s.closing.Store(true)
	s.stopCreate()
	if s.createDone != nil {
		<-s.createDone
	}
	s.nc.Close()
	if err != nil {
		return fmt.Errorf("outbox: nats: close: in-flight sends still running: %w", err)
	}
	select {
	case <-s.connClosed:
	case <-ctx.Done():
		return fmt.Errorf("outbox: nats: close: %w", ctx.Err())
	}
	return nil
}

// waitConnected waits until the connection is up or ctx ends.
func (s *Sink) waitConnected(ctx context.Context) error {
	if s.nc.Status() == nats.CONNECTED {
		return nil
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		switch s.nc.Status() {
		case nats.CONNECTED:
			return nil
		case nats.CLOSED:
			return sinks.ErrClosed
		}
		select {
		case <-ctx.Done():
			cause := s.nc.LastError()
			if cause == nil {
				cause = errors.New(s.nc.Status().String())
			}
			return fmt.Errorf("%w (%w): %w", ErrNotConnected, cause, ctx.Err())
		case <-t.C:
		}
	}
}

// Send publishes msgs and waits for their acks. See sinks.Sink for the
// contract and the package doc for the rounds that keep per-key order.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: nats", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	if err := s.waitConnected(ctx); err != nil {
		if errors.Is(err, sinks.ErrClosed) {
			return err
		}
		return sinks.NotSent(err)
	}
	if s.streamReady != nil {
		select {
		case <-s.streamReady:
		case <-ctx.Done():
			return sinks.NotSent(fmt.Errorf("outbox: nats: create_stream: stream %q not created yet: %w", s.cfg.Stream, ctx.Err()))
		}
	}
	b := &batch{s: s, msgs: msgs, be: sinks.NewBatchError(len(msgs)), nm: make([]*nats.Msg, len(msgs))}
	maxPayload := s.nc.MaxPayload()
	var rounds [][]int
	seen := make(map[string]int)
	for i, m := range msgs {
		nm, err := s.prepare(m, maxPayload)
		if err != nil {
			b.be.Errs[i] = sinks.Permanent(err)
		}
		b.nm[i] = nm
		r := 0
		if m.Key != "" && s.cfg.Ordering == OrderingStrict {
			r = seen[m.Key]
			seen[m.Key] = r + 1
		}
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	for _, round := range rounds {
		b.round(ctx, round)
	}
	if s.cfg.Ordering == OrderingPipelined {
		b.checkPipelined()
	}
	return b.be.Err()
}

// prepare builds the NATS message, refusing what the server can never
// accept.
func (s *Sink) prepare(m sinks.Message, maxPayload int64) (*nats.Msg, error) {
	subject := s.subject.Render(m.Topic, m.Key, m.Headers)
	if err := checkSubject(subject); err != nil {
		return nil, fmt.Errorf("outbox: nats: subject %q: %w", subject, err)
	}
	h := make(nats.Header, len(m.Headers)+4)
	// Every header has one value: one array holds them all (one
	// allocation per message, not one per header).
	vals := make([]string, 0, len(m.Headers)+4)
	one := func(v string) []string {
		vals = append(vals, v)
		return vals[len(vals)-1 : len(vals) : len(vals)]
	}
	size := len("NATS/1.0\r\n\r\n")
	for k, v := range m.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		h[k] = one(v)
		size += len(k) + len(v) + 4
	}
	h[HeaderMsgID] = one(m.ID)
	size += len(HeaderMsgID) + len(m.ID) + 4
	seq := strconv.FormatInt(m.Seq, 10)
	h[HeaderSeq] = one(seq)
	size += len(HeaderSeq) + len(seq) + 4
	if m.Key != "" {
		if strings.ContainsAny(m.Key, "\r\n") {
			return nil, errors.New("outbox: nats: key: contains CR or LF, which a NATS header cannot carry")
		}
		h[HeaderKey] = one(m.Key)
		size += len(HeaderKey) + len(m.Key) + 4
	}
	if s.cfg.Stream != "" {
		h[jetstream.ExpectedStreamHeader] = one(s.cfg.Stream)
		size += len(jetstream.ExpectedStreamHeader) + len(s.cfg.Stream) + 4
	}
	if maxPayload > 0 && int64(size+len(m.Payload)) > maxPayload {
		return nil, fmt.Errorf("%w: %d bytes (payload and headers) exceed the server's max_payload of %d", ErrTooLarge, size+len(m.Payload), maxPayload)
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Payload}, nil
}

// checkSubject refuses a subject the server would not route: empty,
// empty tokens, wildcards or white space.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	for rest := s; ; {
		tok, after, more := strings.Cut(rest, ".")
		if tok == "" {
			return errors.New("has an empty token")
		}
		if tok == "*" || tok == ">" {
			return errors.New("has a wildcard token")
		}
		if !more {
			break
		}
		rest = after
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("contains white space or control characters")
	}
	return nil
}

// checkHeader refuses a header that would break the NATS header block
// (header injection) or that the sink sets itself.
func checkHeader(k, v string) error {
	if k == "" {
		return errors.New("outbox: nats: header: empty name")
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return fmt.Errorf("outbox: nats: header %q: name must be printable ASCII without ':' or spaces", k)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("outbox: nats: header %q: value contains CR or LF", k)
	}
	if strings.HasPrefix(strings.ToLower(k), "nats-") || k == HeaderKey {
		return fmt.Errorf("outbox: nats: header %q: reserved (the sink or the server sets it)", k)
	}
	return nil
}

// batch is the state of one Send.
type batch struct {
	s    *Sink
	msgs []sinks.Message
	nm   []*nats.Msg
	be   *sinks.BatchError
	gate sinks.KeyGate
}

type pending struct {
	i   int
	paf jetstream.PubAckFuture
}

// round publishes the messages at idx (no two share a key) and collects
// their acks.
func (b *batch) round(ctx context.Context, idx []int) {
	fl := make([]pending, 0, len(idx))
	stall := time.Second
	if dl, ok := ctx.Deadline(); ok {
		stall = max(time.Until(dl), time.Millisecond)
	}
	opts := []jetstream.PublishOpt{jetstream.WithRetryAttempts(0), jetstream.WithStallWait(stall)}
	for _, i := range idx {
		m := b.msgs[i]
		switch {
		case b.gate.Blocked(m):
			b.be.Errs[i] = sinks.ErrNotAttempted
			continue
		case b.be.Errs[i] != nil: // refused by prepare: permanent
			b.gate.Fail(m)
			continue
		}
		paf, err := b.s.js.PublishMsgAsync(b.nm[i], opts...)
		if err != nil {
			b.be.Errs[i] = b.s.publishErr(err)
			b.gate.Fail(m)
			continue
		}
		fl = append(fl, pending{i: i, paf: paf})
	}
	for k, p := range fl {
		var err error
		select {
		case <-p.paf.Ok():
		case err = <-p.paf.Err():
			err = b.s.ackErr(ctx, b.nm[p.i].Subject, err)
		case <-ctx.Done():
			err = fmt.Errorf("%w: %w", ErrNoAck, ctx.Err())
			// Those after k are not waited for either: the Send is over.
			for _, q := range fl[k:] {
				select {
				case <-q.paf.Ok():
				default:
					b.be.Errs[q.i] = err
					b.gate.Fail(b.msgs[q.i])
				}
			}
			return
		}
		if err != nil {
			b.be.Errs[p.i] = err
			b.gate.Fail(b.msgs[p.i])
		}
	}
}

// checkPipelined reports, for a pipelined batch, each key whose message
// failed while a later one of the key was stored: its order is broken in
// the stream. That later message is delivered; the earlier one will be
// retried after it.
func (b *batch) checkPipelined() {
	failed := map[string]int{}
	for i, m := range b.msgs {
		if m.Key == "" {
			continue
		}
		err := b.be.Errs[i]
		if err != nil && !sinks.IsPermanent(err) {
			if _, ok := failed[m.Key]; !ok {
				failed[m.Key] = i
			}
			continue
		}
		if f, ok := failed[m.Key]; ok && err == nil {
			b.s.log.Warn("nats: per-key order broken (ordering=pipelined): a later message of the key was stored before an earlier one that failed",
				"key", m.Key, "failed_id", b.msgs[f].ID, "stored_id", m.ID, "err", b.be.Errs[f])
			delete(failed, m.Key)
		}
	}
}

// publishErr classifies an error of the publish call itself (the message
// was not handed to the connection).
func (s *Sink) publishErr(err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return sinks.Permanent(fmt.Errorf("%w: %w", ErrTooLarge, err))
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return sinks.NotSent(fmt.Errorf("outbox: nats: publish: %w", err))
	}
	return fmt.Errorf("outbox: nats: publish: %w", err)
}

// noStream classifies a message whose subject no stream covers. When the
// sink's own stream (Config.Stream) does not exist, or the sink has one
// subject for every message, nothing can be delivered until a stream is
// created: the destination is down, not the message wrong, so the
// message is not sent (the relay counts no attempt and probes until a
// stream takes it). A subject of the message's own (a template) that no
// stream covers, while the sink's stream exists, is that message's
// permanent failure.
func (s *Sink) noStream(ctx context.Context, subject string) error {
	if s.cfg.Stream != "" {
		_, err := s.js.Stream(ctx, s.cfg.Stream)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return sinks.NotSent(fmt.Errorf("%w: stream %q does not exist: create it (or set create_stream)", ErrNoStream, s.cfg.Stream))
		case err != nil:
			// The lookup says nothing of the message: retry it.
			return sinks.Unavailable(fmt.Errorf("outbox: nats: no stream for subject %q, and looking up stream %q failed: %w", subject, s.cfg.Stream, err))
		}
	} else if s.subject.Fixed() {
		return sinks.NotSent(fmt.Errorf("%w for subject %q, the sink's only subject: create a stream whose subjects cover it", ErrNoStream, subject))
	}
	return sinks.Permanent(fmt.Errorf("%w for subject %q: create a stream whose subjects cover it, or route the message elsewhere", ErrNoStream, subject))
}

// ackErr classifies the failure of a published message.
func (s *Sink) ackErr(ctx context.Context, subject string, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// Nobody answered: either no stream covers the subject (permanent),
		// or its leader is being elected (retry). Ask the server which.
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		name, lerr := s.js.StreamNameBySubject(lctx, subject)
		if errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return s.noStream(lctx, subject)
		}
		// The stream exists (or JetStream does not answer either): the
		// stream, not the message, is unavailable.
		if lerr != nil {
			return sinks.Unavailable(fmt.Errorf("outbox: nats: no response from a stream for subject %q, and looking it up failed: %w", subject, lerr))
		}
		return sinks.Unavailable(fmt.Errorf("outbox: nats: no response from stream %q for subject %q (leader election?): %w", name, subject, err))
	case errors.As(err, &apiErr) && apiErr.ErrorCode == codeMessageTooLarge:
		return sinks.Permanent(fmt.Errorf("%w: %w", ErrTooLarge, err))
	case errors.As(err, &apiErr) && apiErr.ErrorCode == codeStreamMismatch:
		return sinks.Permanent(fmt.Errorf("outbox: nats: subject %q is not stored by stream %q: %w", subject, s.cfg.Stream, err))
	case errors.As(err, &apiErr) && apiErr.Code == 503:
		// JetStream answers 503 when it is unavailable as a whole
		// (temporarily unavailable, not enabled, no quorum).
		return sinks.Unavailable(fmt.Errorf("outbox: nats: JetStream unavailable: %w", err))
	case errors.As(err, &apiErr):
		// Stream full with discard new, storage failures, cluster
		// trouble: the server may take it later.
		return fmt.Errorf("outbox: nats: stream refused the message: %w", err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionClosed):
		// Published, and no ack came before the timeout or the
		// connection went: the server may have it.
		return sinks.Unavailable(fmt.Errorf("%w: %w", ErrNoAck, err))
	}
	return fmt.Errorf("outbox: nats: %w", err)
}
