// Package amqpsink publishes outbox messages to RabbitMQ (AMQP 0-9-1) with
// publisher confirms and mandatory routing, so that Send reports success
// only for messages the broker confirmed and routed to at least one queue.
//
// The sink keeps one connection, redialed with backoff when it is lost, and
// a small pool of confirm-mode channels: each Send owns one channel while it
// runs, which keeps its confirms and returns apart from other Sends. It never
// declares queues or bindings; topology belongs to the operator.
//
// It does not consume, and it does not retry by itself: every failure goes
// back to the relay, which persists the retry schedule in the outbox row.
package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// returnBuffer is the capacity of each channel's basic.return queue and so
// the most messages published before the sink stops to collect confirms.
// The client library blocks its frame reader (for up to 5 s, then drops the
// return) when that queue is full; bounding what is in flight by its size
// means no return can be dropped, so no unroutable message can pass for a
// success.
const returnBuffer = 512

var (
	// ErrUnroutable is wrapped by the error of a message the broker
	// returned because no queue is bound for its routing key.
	ErrUnroutable = errors.New("outbox: amqp: unroutable")
	// ErrNotConnected is wrapped by the error of a Send that found no
	// connection to the broker within its deadline.
	ErrNotConnected = errors.New("outbox: amqp: not connected")
	// ErrNacked is wrapped by the error of a message the broker refused
	// with basic.nack.
	ErrNacked = errors.New("outbox: amqp: nacked by broker")
	// ErrNotConfirmed is wrapped by the error of a message whose confirm
	// never came: the channel or connection closed, or the publish
	// timeout expired. The message may or may not have been enqueued.
	ErrNotConfirmed = errors.New("outbox: amqp: not confirmed")
	// ErrBlocked is returned by a Send that starts while the broker blocks
	// publishers (connection.blocked: a memory or disk alarm).
	ErrBlocked = errors.New("outbox: amqp: connection blocked by the broker")
	// ErrAccessRefused is wrapped by the connection error when the broker
	// refuses the URL's user, password or virtual host (AMQP 403
	// ACCESS_REFUSED). The sink keeps trying, quietly: Healthy reports it,
	// and CheckStart fails with it at start-up.
	ErrAccessRefused = errors.New("outbox: amqp: the broker refuses the credentials or the virtual host")
	// ErrExchangeMissing is reported by Healthy while the sink's exchange
	// does not exist: the broker is reachable, but nothing can be
	// delivered (every publish would fail with NOT_FOUND).
	ErrExchangeMissing = errors.New("outbox: amqp: the exchange does not exist")
)

// exchangeRecheck is how often Healthy checks again an exchange found
// missing (a readiness probe every second costs a channel a second).
const exchangeRecheck = time.Second

// stuckGrace is how long a publish may stay stuck in a socket write after
// the Send's context ended before the sink closes the connection to free
// it. A broker under a resource alarm stops reading from publishers'
// sockets, and the client library's writes do not honour contexts.
const stuckGrace = 500 * time.Millisecond

// Sink publishes to one exchange of one RabbitMQ broker. It implements
// sinks.Sink and sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	exchange string // "" for the default exchange
	route    sinkconf.Template
	url      string
	addr     string // url without the password, for logs and errors
	dialCfg  amqp.Config
	log      *slog.Logger

	sem      chan struct{} // one token per channel in use
	stopping chan struct{} // closed when Close starts: no new work
	kill     chan struct{} // closed when in-flight Sends are over
	runDone  chan struct{} // closed when the connection loop has exited
	stopOnce sync.Once
	killOnce sync.Once
	bg       sync.WaitGroup // background channel closes
	inflight sinks.Inflight // the Sends in progress

	// exchangeErr is the verdict of the last check of the exchange on the
	// current connection (nil: it exists or is not checked), at
	// exchangeAt. Guarded by mu.
	exchangeErr error
	exchangeAt  time.Time

	mu      sync.Mutex
	closed  bool
	conn    *connState    // nil while disconnected
	ready   chan struct{} // closed when conn becomes non-nil
	lastErr error         // why the sink is disconnected
	dials   int           // failed connection attempts so far
	blocked string        // broker's connection.blocked reason, "" if not
	idle    []*pubChannel
}

// connState is one live connection.
type connState struct {
	c    *amqp.Connection
	done chan struct{} // closed by the connection loop once c is gone
}

// pubChannel is a confirm-mode channel owned by at most one Send at a time,
// so its confirm sequence and returns belong to that Send alone.
type pubChannel struct {
	cs       *connState
	ch       *amqp.Channel
	returns  chan amqp.Return // nil once the library closed it
	closes   chan *amqp.Error
	gone     bool
	closeErr *amqp.Error
}

// dead reports whether the channel was closed, remembering the broker's
// reason.
func (pc *pubChannel) dead() bool {
	if pc.gone {
		return true
	}
	select {
	case e, ok := <-pc.closes:
		pc.gone = true
		if ok {
			pc.closeErr = e
		}
		return true
	default:
	}
	if pc.ch.IsClosed() || pc.cs.c.IsClosed() {
		// The library marks the channel closed before it notifies the
		// listeners; wait for that (it always ends by closing pc.closes)
		// to learn the broker's reason.
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case e, ok := <-pc.closes:
			if ok {
				pc.closeErr = e
			}
		case <-t.C:
		}
		pc.gone = true
		return true
	}
	return false
}

// New returns a sink for cfg. It validates cfg, applies the defaults and
// starts connecting in the background: New does not fail when the broker is
// down (Send waits for the connection, Healthy reports it). logger may be
// nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	route, err := sinkconf.ParseTemplate(cfg.RoutingKey)
	if err != nil {
		return nil, fmt.Errorf("outbox: amqp: routing_key: %w", err)
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(cfg.ConnectionName)
	s := &Sink{
		cfg:      cfg,
		exchange: cfg.Exchange,
		route:    route,
		url:      cfg.URL,
		addr:     Config{URL: cfg.URL}.Redacted(),
		dialCfg: amqp.Config{
			Heartbeat:       cfg.Heartbeat,
			TLSClientConfig: tc,
			Properties:      props,
			Locale:          "en_US",
			Dial:            amqp.DefaultDial(cfg.DialTimeout),
		},
		log:      logger.With("sink", "amqp", "exchange", cfg.Exchange),
		sem:      make(chan struct{}, cfg.Channels),
		stopping: make(chan struct{}),
		kill:     make(chan struct{}),
		runDone:  make(chan struct{}),
		ready:    make(chan struct{}),
		lastErr:  errors.New("connecting"),
	}
	if s.exchange == DefaultExchangeName {
		s.exchange = ""
	}
	go s.run()
	return s, nil
}

// run keeps one connection open until Close, redialing with backoff.
func (s *Sink) run() {
	defer close(s.runDone)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = s.cfg.ReconnectInitial
	b.MaxInterval = s.cfg.ReconnectMax
	// Doubling with ±20 % jitter, as documented (the library's 1.5 and
	// ±50 % would put a dial up to 1.5 × reconnect_max after the last).
	b.Multiplier, b.RandomizationFactor = 2, 0.2
	b.MaxElapsedTime = 0
	b.Reset()
	wait := func() bool {
		t := time.NewTimer(b.NextBackOff())
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-s.stopping:
			return false
		}
	}
	lastLogged := ""
	for {
		select {
		case <-s.stopping:
			return
		default:
		}
		c, err := s.dial()
		if err != nil {
			s.dialFailed(err, lastLogged)
			lastLogged = err.Error()
			if !wait() {
				return
			}
			continue
		}
		lastLogged = ""
		b.Reset()
		if !s.serve(c) || !wait() {
			return
		}
	}
}

// dialFailed records a failed dial and logs it; lastLogged is the failure
// logged before, if any: refused credentials are said once, not at every
// redial.
func (s *Sink) dialFailed(err error, lastLogged string) {
	s.mu.Lock()
	s.lastErr = err
	s.dials++
	s.mu.Unlock()
	switch {
	case err.Error() == lastLogged:
		s.log.Debug("amqp connect failed again", "err", err)
	case errors.Is(err, ErrAccessRefused):
		s.log.Error("amqp: the broker refuses the credentials or the virtual host; retrying quietly (fix the sink URL's user, password or vhost)", "err", err)
	default:
		s.log.Warn("amqp connect failed", "err", err)
	}
}

// serve makes c the sink's connection and watches it: it returns true when
// the connection was lost (run redials), false when Close ended it.
func (s *Sink) serve(c *amqp.Connection) bool {
	cs := &connState{c: c, done: make(chan struct{})}
	closes := c.NotifyClose(make(chan *amqp.Error, 1))
	blocks := c.NotifyBlocked(make(chan amqp.Blocking, 4))
	s.mu.Lock()
	s.conn, s.lastErr, s.blocked = cs, nil, ""
	close(s.ready)
	s.mu.Unlock()
	s.log.Info("amqp connected", "url", s.addr)
	s.checkExchange(c)

	var reason error
	for reason == nil {
		select {
		case e, ok := <-closes:
			if ok && e != nil {
				reason = e
			} else {
				reason = errors.New("connection closed")
			}
		case bl := <-blocks:
			s.mu.Lock()
			s.blocked = ""
			if bl.Active {
				s.blocked = bl.Reason
			}
			s.mu.Unlock()
			s.log.Warn("amqp connection flow control", "blocked", bl.Active, "reason", bl.Reason)
		case <-s.kill:
			s.mu.Lock()
			s.conn, s.idle, s.lastErr = nil, nil, sinks.ErrClosed
			s.mu.Unlock()
			// Also ends every channel still open. The deadline bounds the
			// close handshake when the broker stopped reading.
			_ = c.CloseDeadline(time.Now().Add(s.cfg.DialTimeout))
			close(cs.done)
			return false
		}
	}
	s.mu.Lock()
	s.conn, s.idle, s.blocked = nil, nil, ""
	s.lastErr = fmt.Errorf("connection lost: %w", reason)
	s.ready = make(chan struct{})
	s.mu.Unlock()
	close(cs.done)
	s.log.Warn("amqp connection lost; reconnecting", "err", reason)
	return true
}

// dial opens a connection and, with declare_exchange=passive, checks the
// exchange.
func (s *Sink) dial() (*amqp.Connection, error) {
	c, err := amqp.DialConfig(s.url, s.dialCfg)
	if err != nil {
		var ae *amqp.Error
		if (errors.As(err, &ae) && ae.Code == amqp.AccessRefused) || errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrSASL) {
			return nil, fmt.Errorf("dial %s: %w: %w", s.addr, ErrAccessRefused, err)
		}
		return nil, fmt.Errorf("dial %s: %w", s.addr, err)
	}
	if s.cfg.DeclareExchange == DeclarePassive && s.exchange != "" {
		ch, err := c.Channel()
		if err == nil {
			err = ch.ExchangeDeclarePassive(s.exchange, "topic", true, false, false, false, nil)
			if err == nil {
				err = ch.Close()
			}
		}
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("check exchange %q: %w", s.exchange, err)
		}
	}
	return c, nil
}

// checkExchange checks, with declare_exchange=none (passive checks at
// every connect), that the exchange exists, and records the verdict for
// Healthy: a missing exchange makes the relay not ready, with the reason,
// instead of retrying every message into the dead letters behind a ready
// probe. The check is a passive declare on a channel of its own; it never
// creates or changes topology. An error other than NOT_FOUND (a channel
// that could not open) says nothing about the exchange: no verdict.
func (s *Sink) checkExchange(c *amqp.Connection) {
	if s.cfg.DeclareExchange != DeclareNone || s.exchange == "" {
		return
	}
	var missing error
	ch, err := c.Channel()
	if err == nil {
		err = ch.ExchangeDeclarePassive(s.exchange, "topic", true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			missing = fmt.Errorf("%w: %q (%s); create it, or point the sink at an existing one", ErrExchangeMissing, s.exchange, ae.Reason)
		} else if err == nil {
			_ = ch.Close()
		}
	}
	s.mu.Lock()
	was := s.exchangeErr
	s.exchangeErr, s.exchangeAt = missing, time.Now()
	s.mu.Unlock()
	switch {
	case missing != nil && was == nil:
		s.log.Error("amqp: the exchange does not exist: nothing can be delivered; the relay reports not ready until it exists", "err", missing)
	case missing == nil && was != nil:
		s.log.Info("amqp: the exchange exists now")
	}
}

// exchangeGone records that a publish found no exchange (deleted since
// the connection's check): Healthy reports it, and checks again a second
// later.
func (s *Sink) exchangeGone(e *amqp.Error) {
	if s.cfg.DeclareExchange != DeclareNone || s.exchange == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exchangeErr == nil {
		s.exchangeErr = fmt.Errorf("%w: %q (%s); create it, or point the sink at an existing one", ErrExchangeMissing, s.exchange, e.Reason)
		s.exchangeAt = time.Now()
		s.log.Error("amqp: the exchange does not exist: nothing can be delivered; the relay reports not ready until it exists", "err", s.exchangeErr)
	}
}

// Healthy reports whether the sink is connected, not blocked by the
// broker's flow control, and (declare_exchange=none) its exchange exists.
func (s *Sink) Healthy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: amqp: %w", err)
	}
	s.mu.Lock()
	if cs := s.conn; cs != nil && s.exchangeErr != nil && time.Since(s.exchangeAt) >= exchangeRecheck && !cs.c.IsClosed() {
		s.mu.Unlock()
		s.checkExchange(cs.c)
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return sinks.ErrClosed
	case s.conn == nil:
		return fmt.Errorf("%w: %w", ErrNotConnected, s.lastErr)
	case s.conn.c.IsClosed():
		return fmt.Errorf("%w: connection closing", ErrNotConnected)
	case s.blocked != "":
		return fmt.Errorf("%w: %s", ErrBlocked, s.blocked)
	case s.exchangeErr != nil:
		return s.exchangeErr
	}
	return nil
}

// CheckStart implements sinks.StartChecker: it fails when the broker
// refused the credentials or the virtual host at every attempt until ctx
// ended, and returns nil once connected or once a connection attempt
// failed for another reason (a broker that is down may come back; the
// relay runs meanwhile and Sends wait for the connection).
func (s *Sink) CheckStart(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var grace time.Time // when ctx ended during the first attempt: its end
	for {
		s.mu.Lock()
		conn, dials, lastErr := s.conn, s.dials, s.lastErr
		s.mu.Unlock()
		refused := errors.Is(lastErr, ErrAccessRefused)
		switch {
		case conn != nil, dials > 0 && !refused:
			return nil
		case ctx.Err() != nil && dials > 0:
			return lastErr
		case ctx.Err() != nil && grace.IsZero():
			// The first attempt is still under way: its answer decides,
			// within one dial timeout.
			grace = time.Now().Add(s.cfg.DialTimeout)
		case ctx.Err() != nil && time.Now().After(grace):
			return nil
		}
		<-t.C
	}
}

// KeySerial reports that a batch goes out in confirm rounds, one round per
// message of its busiest key (sinks.KeySerial).
func (s *Sink) KeySerial() bool { return true }

// BatchLanes asks the relay for batches drawn from at least 32 lanes: a
// batch goes out in one confirm round per message of its busiest key
// (see Send), so the more keys it spans, the fewer rounds. Measured
// against the default 8 (quick bench drain, alternated twice): 0.64 /
// 0.66 → 0.70 / 0.71 × the raw publisher; 64 lanes did no better (0.70,
// 0.68) and 128 worse (0.66, 0.63). Webhooks and strict NATS were no
// faster with 32 (docs/benchmarks.md), so they keep the default.
func (s *Sink) BatchLanes() int { return 32 }

// Close stops new Sends, waits for in-flight Sends or ctx, then closes the
// connection, returning when it is closed or when ctx ends. It is
// idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stopping) })

	err := s.inflight.Close(ctx)
	if err != nil {
		// Closing the connection below ends the stragglers: their
		// unconfirmed messages fail as retriable.
		err = fmt.Errorf("outbox: amqp: close: in-flight sends still running: %w", err)
	}
	s.killOnce.Do(func() { close(s.kill) })
	// The connection loop may be in a dial (up to dial_timeout against a
	// host that does not answer) or in the close handshake: a stop does
	// not wait for either past ctx. The loop ends by itself after them.
	done := make(chan struct{})
	go func() {
		<-s.runDone
		s.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("outbox: amqp: close: the connection is still dialling or closing: %w", ctx.Err()))
	}
	return err
}

// acquire returns a channel for the caller's exclusive use, waiting for a
// connection and a free slot until ctx ends.
func (s *Sink) acquire(ctx context.Context) (*pubChannel, error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("outbox: amqp: waiting for a free channel: %w", ctx.Err())
	case <-s.stopping:
		return nil, sinks.ErrClosed
	}
	for {
		s.mu.Lock()
		cs, ready, lastErr := s.conn, s.ready, s.lastErr
		for cs != nil && len(s.idle) > 0 {
			pc := s.idle[len(s.idle)-1]
			s.idle = s.idle[:len(s.idle)-1]
			if pc.cs == cs && !pc.dead() {
				s.mu.Unlock()
				return pc, nil
			}
			s.discard(pc)
		}
		s.mu.Unlock()

		if cs == nil && errors.Is(lastErr, ErrAccessRefused) {
			// The broker answered and refused the credentials or the
			// virtual host: waiting out the send's deadline would only
			// make every probe of the outage last as long. The loop
			// keeps dialling and a later Send finds the connection.
			<-s.sem
			return nil, sinks.NotSent(fmt.Errorf("%w: %w", ErrNotConnected, lastErr))
		}
		// While disconnected, wait for the next connection; when the
		// connection just died, wait for the loop to notice (it then
		// clears s.conn and installs a fresh ready channel).
		wake := ready
		if cs != nil {
			pc, err := s.open(cs)
			if err == nil {
				return pc, nil
			}
			if !cs.c.IsClosed() {
				// No channel, so nothing of the batch was sent.
				<-s.sem
				return nil, sinks.NotSent(fmt.Errorf("outbox: amqp: open channel: %w", err))
			}
			wake, lastErr = cs.done, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			<-s.sem
			s.mu.Lock()
			if s.lastErr != nil {
				lastErr = s.lastErr // the latest reason, not the one from before the wait
			}
			s.mu.Unlock()
			// No connection, so nothing of the batch was sent.
			return nil, sinks.NotSent(fmt.Errorf("%w (%w): %w", ErrNotConnected, lastErr, ctx.Err()))
		case <-s.stopping:
			<-s.sem
			return nil, sinks.ErrClosed
		}
	}
}

func (s *Sink) open(cs *connState) (*pubChannel, error) {
	ch, err := cs.c.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return &pubChannel{
		cs:      cs,
		ch:      ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, returnBuffer)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// release gives pc back to the pool when it is clean (every publish
// confirmed, every return collected), else closes it.
func (s *Sink) release(pc *pubChannel, clean bool) {
	s.mu.Lock()
	if clean && pc.cs == s.conn && !s.closed && !pc.dead() {
		s.idle = append(s.idle, pc)
	} else {
		s.discard(pc)
	}
	s.mu.Unlock()
	<-s.sem
}

// discard closes pc in the background: channel.close waits for the broker's
// answer, which a stalled broker may never send (the connection close in
// Close ends that wait).
//
// Callers hold s.mu. A channel of a connection that is no longer current
// needs no close: that connection is gone or being closed, which ends its
// channels; skipping it also keeps bg.Add from racing Close's bg.Wait.
func (s *Sink) discard(pc *pubChannel) {
	if pc.cs != s.conn || pc.dead() {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		_ = pc.ch.Close()
	}()
}

// Send publishes msgs and waits for their confirms. See sinks.Sink for the
// contract and docs/sinks/amqp.md for the failure classes.
//
// Messages that share a key are published one at a time per key: message n
// of key k goes out only after message n-1 of k was confirmed and not
// returned. Publishing both at once would let the broker route n while n-1
// is returned as unroutable or nacked (a queue at its length limit with
// overflow=reject-publish does exactly that), which breaks per-key order.
// So the batch is sent in rounds: round r holds the r-th message of every
// key plus, in round 0, every message without a key; each round is
// published in full on the channel and then its confirms are collected.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: amqp", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	b := &batch{
		s:    s,
		msgs: msgs,
		be:   be,
		keys: make([]string, len(msgs)),
		pubs: make([]amqp.Publishing, len(msgs)),
	}
	var rounds [][]int
	seen := make(map[string]int)
	prepFailed := false
	for i, m := range msgs {
		if err := b.prepare(i); err != nil {
			be.Errs[i] = sinks.Permanent(err)
			prepFailed = true
		}
		r := 0
		if m.Key != "" {
			r = seen[m.Key]
			seen[m.Key] = r + 1
		}
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}

	// Blocked before and after acquire: a blocked broker reads nothing
	// from the connection, not even the channel.open that acquire may
	// send (and that waits for its answer past ctx).
	err := s.blockedErr()
	var pc *pubChannel
	if err == nil {
		pc, err = s.acquire(ctx)
		if err == nil {
			if err = s.blockedErr(); err != nil {
				s.release(pc, true)
			}
		}
	}
	if err != nil {
		if !prepFailed {
			return err
		}
		for _, round := range rounds {
			for _, i := range round {
				b.fail(i, err)
			}
		}
		return be.Err()
	}
	b.pc = pc
	b.done = make(chan struct{})
	defer close(b.done)
	// Free a publish stuck in a socket write once ctx is over (see
	// stuckGrace).
	defer context.AfterFunc(ctx, b.unstick)()
	for _, round := range rounds {
		for start := 0; start < len(round); start += returnBuffer {
			b.publish(ctx, round[start:min(start+returnBuffer, len(round))])
		}
	}
	s.release(pc, b.broken == nil)
	return be.Err()
}

// blockedErr reports, marked not sent, that the broker blocks the
// connection (connection.blocked: a memory or disk alarm): it reads no
// publish of any publisher, so nothing would be sent.
func (s *Sink) blockedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked == "" {
		return nil
	}
	return sinks.NotSent(fmt.Errorf("%w: %s", ErrBlocked, s.blocked))
}

// batch is the state of one Send.
type batch struct {
	done     chan struct{} // closed when Send returns
	pubState atomic.Uint64 // odd while inside a publish call
	s        *Sink
	pc       *pubChannel
	msgs     []sinks.Message
	be       *sinks.BatchError
	keys     []string // routing keys
	pubs     []amqp.Publishing
	gate     sinks.KeyGate
	broken   error // set once pc must not be used any more
}

// fail records the outcome of message i that was not published because of
// err (or a prepare error already recorded), honouring the key gate.
func (b *batch) fail(i int, err error) {
	m := b.msgs[i]
	switch {
	case b.gate.Blocked(m):
		b.be.Errs[i] = sinks.ErrNotAttempted
	case b.be.Errs[i] != nil: // prepare failed: already permanent
		b.gate.Fail(m)
	default:
		b.be.Errs[i] = err
		b.gate.Fail(m)
	}
}

// prepare builds the routing key and properties of message i, rejecting
// what the broker or the AMQP encoding can never accept.
func (b *batch) prepare(i int) error {
	s, m := b.s, b.msgs[i]
	if len(m.Payload) > s.cfg.MaxMessageSize {
		return fmt.Errorf("outbox: amqp: message of %d bytes exceeds max_message_size %d", len(m.Payload), s.cfg.MaxMessageSize)
	}
	rk := s.route.Render(m.Topic, m.Key, m.Headers)
	if len(rk) > 255 {
		return fmt.Errorf("outbox: amqp: routing key of %d bytes exceeds the AMQP limit of 255", len(rk))
	}
	for _, f := range []struct{ name, v string }{{"message id", m.ID}, {"topic", m.Topic}} {
		if len(f.v) > 255 {
			return fmt.Errorf("outbox: amqp: %s of %d bytes exceeds the AMQP limit of 255", f.name, len(f.v))
		}
	}
	headers := make(amqp.Table, len(m.Headers)+2)
	contentType := s.cfg.ContentType
	for k, v := range m.Headers {
		if len(k) > 255 {
			return fmt.Errorf("outbox: amqp: header name of %d bytes exceeds the AMQP limit of 255", len(k))
		}
		if strings.EqualFold(k, "content-type") && v != "" {
			if len(v) > 255 {
				return fmt.Errorf("outbox: amqp: content-type header of %d bytes exceeds the AMQP limit of 255", len(v))
			}
			contentType = v
		}
		headers[k] = v
	}
	if m.Key != "" {
		headers[HeaderKey] = m.Key
	}
	headers[HeaderSeq] = m.Seq
	b.keys[i] = rk
	b.pubs[i] = amqp.Publishing{
		Headers:      headers,
		ContentType:  contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    m.CreatedAt,
		Type:         m.Topic,
		AppId:        "outbox-relay",
		Body:         m.Payload,
	}
	return nil
}

type inflight struct {
	i  int
	dc *amqp.DeferredConfirmation
}

// publish sends the messages at idx (at most returnBuffer, no two with the
// same key) and collects their confirms and returns.
func (b *batch) publish(ctx context.Context, idx []int) {
	fl, byID := b.send(ctx, idx)
	if len(fl) == 0 {
		return
	}
	returned, timeout := b.collect(ctx, fl, byID)
	b.settle(fl, returned, timeout)
	if timeout != nil && b.broken == nil {
		// Late confirms and returns would land in the next Send's round.
		b.broken = timeout
	}
}

// send publishes the messages at idx that may go, failing the others, and
// returns those in flight with, by message id, their positions in fl in
// publish order.
func (b *batch) send(ctx context.Context, idx []int) (fl []inflight, byID map[string][]int) {
	fl = make([]inflight, 0, len(idx))
	byID = make(map[string][]int, len(idx))
	for _, i := range idx {
		m := b.msgs[i]
		if b.gate.Blocked(m) || b.be.Errs[i] != nil {
			b.fail(i, nil)
			continue
		}
		if b.broken != nil {
			b.fail(i, sinks.NotSent(fmt.Errorf("%w: %w", ErrNotConfirmed, b.broken)))
			continue
		}
		b.pubState.Add(1)
		dc, err := b.pc.ch.PublishWithDeferredConfirmWithContext(ctx, b.s.exchange, b.keys[i], true, false, b.pubs[i])
		b.pubState.Add(1)
		if err != nil {
			b.broken = b.channelErr(err)
			b.fail(i, b.lost(fmt.Errorf("%w: publish: %w", ErrNotConfirmed, b.broken)))
			continue
		}
		byID[m.ID] = append(byID[m.ID], len(fl))
		fl = append(fl, inflight{i: i, dc: dc})
	}
	return fl, byID
}

// collect waits for every confirm of fl, or for ctx (then it returns ctx's
// error), and gathers the broker's returns: by position in fl.
func (b *batch) collect(ctx context.Context, fl []inflight, byID map[string][]int) (returned map[int]amqp.Return, timeout error) {
	returned = make(map[int]amqp.Return)
	record := func(r amqp.Return, ok bool) {
		if !ok {
			b.pc.returns = nil // closed with the channel
			return
		}
		q := byID[r.MessageId]
		if len(q) == 0 {
			// Cannot be ours: every earlier publish on this channel was
			// settled before this round started.
			b.s.log.Warn("amqp return for an unknown message", "message_id", r.MessageId)
			return
		}
		returned[q[0]] = r
		byID[r.MessageId] = q[1:]
	}
wait:
	for k := range fl {
		for {
			select {
			case <-fl[k].dc.Done():
				continue wait
			case r, ok := <-b.pc.returns:
				record(r, ok)
			case <-ctx.Done():
				timeout = ctx.Err()
				break wait
			}
		}
	}
	// The library hands a basic.return to the returns queue before it
	// processes the basic.ack that follows it, so once a confirm is done
	// its return (if any) is already queued.
	for drained := false; !drained && b.pc.returns != nil; {
		select {
		case r, ok := <-b.pc.returns:
			record(r, ok)
		default:
			drained = true
		}
	}
	return returned, timeout
}

// settle records the outcome of each message of fl: returned
// (unroutable), acked, nacked, lost with the channel, or unconfirmed when
// timeout ended the wait.
func (b *batch) settle(fl []inflight, returned map[int]amqp.Return, timeout error) {
	for k, f := range fl {
		i, m := f.i, b.msgs[f.i]
		if r, ok := returned[k]; ok {
			err := fmt.Errorf("%w: exchange %q routing key %q: %d %s", ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
			if b.s.cfg.Unroutable == UnroutablePermanent {
				err = sinks.Permanent(err)
			}
			b.be.Errs[i] = err
			b.gate.Fail(m)
			continue
		}
		select {
		case <-f.dc.Done():
			if f.dc.Acked() {
				continue
			}
			if b.pc.dead() {
				// The library nacks every pending confirm when the
				// channel or connection closes.
				b.broken = b.channelErr(amqp.ErrClosed)
				b.be.Errs[i] = b.lost(fmt.Errorf("%w: %w", ErrNotConfirmed, b.broken))
			} else {
				// The broker could not store it (a queue refused it,
				// a quorum queue without its quorum): the broker, not
				// the message, failed.
				b.be.Errs[i] = sinks.Unavailable(ErrNacked)
			}
		default:
			b.be.Errs[i] = unconfirmed(timeout)
		}
		b.gate.Fail(m)
	}
}

// unconfirmed is the error of a message whose confirm had not come when
// the wait ended with timeout (ctx's error). Past the deadline (the
// publish timeout, or the caller's), the broker did not answer in time:
// the destination unavailable, as a timeout is for every sink, and the
// message may have been enqueued. A cancelled wait says nothing of the
// broker.
func unconfirmed(timeout error) error {
	err := fmt.Errorf("%w: no confirm within the publish timeout or ctx: %w", ErrNotConfirmed, timeout)
	if errors.Is(timeout, context.DeadlineExceeded) {
		return sinks.Unavailable(err)
	}
	return err
}

// unstick runs when the Send's context ends. If a publish call is in
// progress and still the same one stuckGrace later, its socket write is
// stuck (the broker stopped reading): closing the connection with an
// immediate deadline makes the write fail. Every Send on the connection
// then fails as retriable and the sink reconnects.
func (b *batch) unstick() {
	v := b.pubState.Load()
	if v%2 == 0 {
		return
	}
	t := time.NewTimer(stuckGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-b.done:
		return
	}
	if b.pubState.Load() == v {
		b.s.log.Warn("amqp publish stuck after the send's deadline; closing the connection")
		_ = b.pc.cs.c.CloseDeadline(time.Now())
	}
}

// lost marks err, the failure of a message that went out on b's channel,
// as the destination unavailable (sinks.Unavailable) when the connection
// is gone (or its socket failed), or when the broker closed it for a
// reason of its own (see brokerClose): the broker stopped answering, and
// may have the message. A channel the broker closed on a live connection
// for the message's sake (an exchange that does not exist, a message over
// the broker's size limit) leaves err as it is.
func (b *batch) lost(err error) error {
	var oe *net.OpError
	var ae *amqp.Error
	if errors.Is(err, ErrExchangeMissing) {
		// The broker dropped the publish: nothing of the message arrived,
		// and nothing can until the exchange exists. The destination is
		// down (no attempt counted), not the message wrong.
		return sinks.NotSent(err)
	}
	// The socket's own error comes first when the write fails before the
	// library's reader has seen the connection go.
	if b.pc.cs.c.IsClosed() || errors.As(err, &oe) || errors.Is(err, io.EOF) ||
		errors.As(err, &ae) && brokerClose(ae.Code) {
		return sinks.Unavailable(err)
	}
	return err
}

// brokerClose reports whether a close with code says the broker, not a
// message, is at fault: 320 CONNECTION_FORCED (an operator or the broker
// closed the connection: shutdown, rabbitmqctl close_connection) and 506
// RESOURCE_ERROR (the broker lacks the resources: memory, disk, file
// handles).
func brokerClose(code int) bool {
	return code == amqp.ConnectionForced || code == amqp.ResourceError
}

// channelErr explains a failed publish or a lost channel, preferring the
// broker's close reason.
func (b *batch) channelErr(err error) error {
	if b.pc.dead() && b.pc.closeErr != nil {
		if b.pc.closeErr.Code == amqp.NotFound {
			// A publish's only NOT_FOUND: the exchange does not exist.
			b.s.exchangeGone(b.pc.closeErr)
			return fmt.Errorf("channel closed: %w: %q: %w", ErrExchangeMissing, b.s.exchange, b.pc.closeErr)
		}
		return fmt.Errorf("channel closed: %w", b.pc.closeErr)
	}
	if b.pc.cs.c.IsClosed() {
		return fmt.Errorf("connection lost: %w", err)
	}
	return err
}
