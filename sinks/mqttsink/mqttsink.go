// Package mqttsink publishes outbox messages to an MQTT 5 broker
// (Mosquitto, EMQX, HiveMQ) with QoS 1.
//
// A message is delivered when the broker's PUBACK for it came back with a
// success reason code (0x00, or 0x10 "no matching subscribers": the
// broker took the message). A PUBACK with an error reason code fails the
// message: not authorized (0x87), topic name invalid (0x90), packet too
// large (0x95) and payload format invalid (0x99) are permanent; quota
// exceeded (0x97), server unavailable (0x88), server busy (0x89) and
// server shutting down (0x8B) say the broker takes nothing now
// (sinks.Unavailable); the others are retriable. The message id, position and key travel as the user
// properties outbox-id, outbox-seq and outbox-key, next to the
// application's headers; the payload goes as it is.
//
// Per-key order: a key's messages are published one after the other, the
// next only once the previous one's PUBACK arrived, and none after one
// that failed; different keys, and messages without a key, are in flight
// together (up to the broker's Receive Maximum, which the client obeys).
//
// The connection is kept by paho's autopaho, which reconnects forever
// with backoff. Nothing is queued while disconnected: a Send waits for
// the connection (up to its deadline) and reports what it could not send
// as sinks.ErrNotAttempted, so an unreachable broker costs no attempts.
// A message whose PUBACK was lost with the connection, or did not come
// within the publish timeout while the broker held the connection, says
// the broker failed (sinks.Unavailable); it may have arrived, and
// consumers deduplicate on outbox-id.
package mqttsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrTooLarge is wrapped by the (permanent) error of a message larger
	// than the broker's Maximum Packet Size (from its CONNACK), or refused
	// by the broker as too large (PUBACK 0x95).
	ErrTooLarge = errors.New("outbox: mqtt: message too large")
	// ErrBadTopic is wrapped by the (permanent) error of a message whose
	// topic is not a valid MQTT topic name (empty, a wildcard, NUL, not
	// UTF-8, too long).
	ErrBadTopic = errors.New("outbox: mqtt: invalid topic name")
	// ErrNotConnected is wrapped by the error of a Send that found no
	// connection within its deadline.
	ErrNotConnected = errors.New("outbox: mqtt: not connected")
	// ErrNoPuback is wrapped by the (retriable) error of a message whose
	// PUBACK did not come (the connection dropped, the deadline passed).
	// It may have been delivered.
	ErrNoPuback = errors.New("outbox: mqtt: no PUBACK")
)

// PubackError is a PUBACK with an error reason code (0x80 or above).
type PubackError struct {
	ReasonCode byte
	Reason     string // the reason string the broker sent, if any
}

func (e *PubackError) Error() string {
	s := fmt.Sprintf("outbox: mqtt: broker refused the message: PUBACK reason code 0x%02X (%s)", e.ReasonCode, reasonName(e.ReasonCode))
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Permanent reports whether the broker will refuse the message whatever
// the number of tries: not authorized (0x87), topic name invalid (0x90),
// packet too large (0x95), payload format invalid (0x99).
func (e *PubackError) Permanent() bool {
	switch e.ReasonCode {
	case 0x87, 0x90, 0x95, 0x99:
		return true
	}
	return false
}

// Unavailable reports whether the reason code says the broker takes no
// message from this client now, whatever the message: quota exceeded
// (0x97, the one such code MQTT 5 lists for a PUBACK), and server
// unavailable (0x88), server busy (0x89) and server shutting down (0x8B),
// which it lists for CONNACK and DISCONNECT and which mean the same in a
// PUBACK from a broker that sends them there.
func (e *PubackError) Unavailable() bool {
	switch e.ReasonCode {
	case 0x88, 0x89, 0x8B, 0x97:
		return true
	}
	return false
}

// classified is e as the relay must see it: permanent (ErrTooLarge for
// 0x95), the destination unavailable, or a retriable failure of the
// message.
func (e *PubackError) classified() error {
	switch {
	case e.ReasonCode == 0x95:
		return sinks.Permanent(fmt.Errorf("%w: %w", ErrTooLarge, e))
	case e.Permanent():
		return sinks.Permanent(e)
	case e.Unavailable():
		return sinks.Unavailable(e)
	}
	return e
}

func reasonName(rc byte) string {
	switch rc {
	case 0x80:
		return "unspecified error"
	case 0x83:
		return "implementation specific error"
	case 0x87:
		return "not authorized"
	case 0x88:
		return "server unavailable"
	case 0x89:
		return "server busy"
	case 0x8B:
		return "server shutting down"
	case 0x90:
		return "topic name invalid"
	case 0x91:
		return "packet identifier in use"
	case 0x95:
		return "packet too large"
	case 0x97:
		return "quota exceeded"
	case 0x99:
		return "payload format invalid"
	}
	return "unknown"
}

// conn is one connection's state, from its CONNACK until it drops.
type conn struct {
	maxPacket uint32        // the broker's Maximum Packet Size; 0: none
	down      chan struct{} // closed when the connection drops
	once      sync.Once
}

func (c *conn) close() { c.once.Do(func() { close(c.down) }) }

// Sink publishes to an MQTT 5 broker. It implements sinks.Sink,
// sinks.HealthChecker, sinks.StartChecker and sinks.KeySerial and is safe
// for concurrent use.
type Sink struct {
	cfg      Config
	topic    sinkconf.Template
	cm       *autopaho.ConnectionManager
	log      *slog.Logger
	inflight sinks.Inflight
	stop     context.CancelFunc

	mu      sync.Mutex
	cur     *conn         // nil while disconnected
	up      chan struct{} // closed when cur is set; replaced when it drops
	lastErr error         // the last connection error
	refused error         // the last refusal in a CONNACK, until a connection succeeds
	closing bool
}

// New returns a sink for cfg. It validates cfg, applies the defaults and
// starts connecting in the background: New does not fail when the broker
// is down (Send waits for the connection, Healthy reports it). logger may
// be nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	topic, err := sinkconf.ParseTemplate(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("outbox: mqtt: topic: %w", err)
	}
	b, err := parseBrokers(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("outbox: mqtt: url: %w", err)
	}
	tc, err := cfg.tlsConfig(b)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sink{cfg: cfg, topic: topic, log: logger.With("sink", "mqtt"), up: make(chan struct{})}
	user, pass := cfg.credentials(b)
	ac := autopaho.ClientConfig{
		ServerUrls:                    b.urls,
		TlsCfg:                        tc,
		KeepAlive:                     uint16(cfg.KeepAlive / time.Second),
		CleanStartOnInitialConnection: true,
		SessionExpiryInterval:         uint32(cfg.SessionExpiry / time.Second),
		ReconnectBackoff:              reconnectDelay(cfg.ReconnectInitial, cfg.ReconnectMax),
		ConnectTimeout:                cfg.ConnectTimeout,
		ConnectUsername:               user,
		ConnectPassword:               pass,
		OnConnectionUp:                s.connUp,
		OnConnectionDown:              s.connDown,
		OnConnectError:                s.connectError,
		ClientConfig: paho.ClientConfig{
			ClientID: cfg.ClientID,
			// A Send's context bounds each publish, not paho's own
			// timeout.
			PacketTimeout:      24 * time.Hour,
			OnClientError:      func(err error) { s.dropped(err) },
			OnServerDisconnect: s.serverDisconnect,
		},
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	cm, err := autopaho.NewConnection(ctx, ac)
	if err != nil {
		stop()
		return nil, fmt.Errorf("outbox: mqtt: %w", err)
	}
	s.cm = cm
	return s, nil
}

// reconnectDelay is autopaho's backoff: none before the first attempt,
// then initial doubling up to maxDelay, ±20 % jitter so that relays
// restarted together do not dial in step.
func reconnectDelay(initial, maxDelay time.Duration) func(int) time.Duration {
	return func(attempt int) time.Duration {
		if attempt == 0 {
			return 0
		}
		d := initial
		for i := 1; i < attempt && d < maxDelay; i++ {
			d *= 2
		}
		d = min(d, maxDelay)
		return d - d/5 + rand.N(2*d/5+1)
	}
}

func (s *Sink) connUp(_ *autopaho.ConnectionManager, ca *paho.Connack) {
	c := &conn{down: make(chan struct{})}
	if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
		c.maxPacket = *ca.Properties.MaximumPacketSize
	}
	s.mu.Lock()
	if s.cur != nil {
		s.cur.close()
	}
	s.cur = c
	s.refused, s.lastErr = nil, nil
	close(s.up)
	s.mu.Unlock()
	s.log.Info("mqtt connected", "client_id", s.cfg.ClientID, "max_packet_size", c.maxPacket)
}

// dropped marks the current connection down (paho reported an error on
// it): the publishes waiting on it stop waiting for their PUBACK.
func (s *Sink) dropped(err error) {
	s.mu.Lock()
	c, closing := s.cur, s.closing
	if c != nil {
		s.cur = nil
		s.up = make(chan struct{})
		s.lastErr = err
	}
	s.mu.Unlock()
	if c != nil {
		c.close()
		if !closing {
			s.log.Warn("mqtt connection lost; reconnecting", "err", err)
		}
	}
}

func (s *Sink) serverDisconnect(d *paho.Disconnect) {
	reason := ""
	if d.Properties != nil {
		reason = d.Properties.ReasonString
	}
	s.dropped(fmt.Errorf("broker sent DISCONNECT, reason code 0x%02X %s", d.ReasonCode, reason))
}

func (s *Sink) connDown() bool {
	s.dropped(errors.New("connection closed"))
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closing
}

func (s *Sink) connectError(err error) {
	var ce *autopaho.ConnackError
	s.mu.Lock()
	first := s.lastErr == nil
	s.lastErr = err
	if errors.As(err, &ce) {
		s.refused = err
	}
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return
	}
	if first {
		s.log.Warn("mqtt connect failed; retrying", "err", err)
	} else {
		s.log.Debug("mqtt connect failed; retrying", "err", err)
	}
}

// KeySerial reports true: a key's messages go one PUBACK after another
// (sinks.KeySerial).
func (s *Sink) KeySerial() bool { return true }

// Healthy reports whether the sink is connected.
func (s *Sink) Healthy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: mqtt: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return sinks.ErrClosed
	case s.cur != nil:
		return nil
	}
	return fmt.Errorf("%w (last error: %v)", ErrNotConnected, s.lastErr)
}

// CheckStart waits until the sink is connected (nil), or until ctx ends:
// it returns an error then only when the broker refused the connection in
// its CONNACK (bad user name or password, not authorized, client id
// refused), which waiting does not fix (sinks.StartChecker).
func (s *Sink) CheckStart(ctx context.Context) error {
	_, err := s.waitConnected(ctx)
	if err == nil {
		return nil
	}
	s.mu.Lock()
	refused := s.refused
	s.mu.Unlock()
	if refused != nil {
		return fmt.Errorf("outbox: mqtt: the broker refuses the connection: %w", refused)
	}
	return nil
}

// Close refuses new Sends, waits for in-flight ones or ctx, then
// disconnects. It is idempotent.
func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.stop()
	select {
	case <-s.cm.Done():
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		return fmt.Errorf("outbox: mqtt: close: %w", err)
	}
	return nil
}

// waitConnected returns the current connection, waiting for one until
// ctx ends.
func (s *Sink) waitConnected(ctx context.Context) (*conn, error) {
	for {
		s.mu.Lock()
		c, up, closing, last := s.cur, s.up, s.closing, s.lastErr
		s.mu.Unlock()
		switch {
		case closing:
			return nil, sinks.ErrClosed
		case c != nil:
			return c, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			if last == nil {
				last = errors.New("connecting")
			}
			return nil, fmt.Errorf("%w (%w): %w", ErrNotConnected, last, ctx.Err())
		}
	}
}

// Send publishes msgs with QoS 1 and waits for their PUBACKs. See
// sinks.Sink for the contract and the package doc for per-key order.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: mqtt", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	c, err := s.waitConnected(ctx)
	if err != nil {
		if errors.Is(err, sinks.ErrClosed) {
			return err
		}
		return sinks.NotSent(err)
	}
	be := sinks.NewBatchError(len(msgs))
	// A lane is a key's messages in batch order, or one message without
	// a key.
	var lanes [][]int
	byKey := make(map[string]int)
	for i, m := range msgs {
		if m.Key == "" {
			lanes = append(lanes, []int{i})
			continue
		}
		l, ok := byKey[m.Key]
		if !ok {
			l = len(lanes)
			byKey[m.Key] = l
			lanes = append(lanes, nil)
		}
		lanes[l] = append(lanes[l], i)
	}
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() {
			for k, i := range lane {
				err := s.publish(ctx, c, msgs[i])
				if err == nil {
					continue
				}
				be.Errs[i] = err
				for _, j := range lane[k+1:] {
					be.Errs[j] = sinks.ErrNotAttempted
				}
				return
			}
		})
	}
	wg.Wait()
	return be.Err()
}

// publish sends one message on c and waits for its PUBACK.
func (s *Sink) publish(ctx context.Context, c *conn, m sinks.Message) error {
	p, err := s.prepare(m, c.maxPacket)
	if err != nil {
		return sinks.Permanent(err)
	}
	// Stop waiting when the connection the message went out on drops:
	// its PUBACK will never come (a session that outlives the connection
	// resends it, and the broker's PUBACK then goes to nobody: the relay
	// retries it).
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.down:
			cancel()
		case <-pctx.Done():
		}
	}()
	select {
	case <-c.down:
		return sinks.NotSent(fmt.Errorf("%w: the connection dropped", ErrNotConnected))
	default:
	}
	if err := ctx.Err(); err != nil {
		return sinks.NotSent(fmt.Errorf("outbox: mqtt: publish: %w", err))
	}
	pr, err := s.cm.Publish(pctx, p)
	switch {
	case pr != nil && pr.ReasonCode >= 0x80:
		pe := &PubackError{ReasonCode: pr.ReasonCode}
		if pr.Properties != nil {
			pe.Reason = pr.Properties.ReasonString
		}
		return pe.classified()
	case err == nil:
		return nil
	case errors.Is(err, autopaho.ConnectionDownError), errors.Is(err, session.ErrNoConnection):
		return sinks.NotSent(fmt.Errorf("%w: %w", ErrNotConnected, err))
	case errors.Is(err, paho.ErrInvalidArguments):
		// The broker's CONNACK forbids what every message needs (a
		// Maximum QoS of 0): the broker's configuration, not the
		// message, is at fault; the message waits for it to change.
		return sinks.NotSent(fmt.Errorf("outbox: mqtt: publish: %w", err))
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The broker holds the connection and answers nothing within
		// the publish timeout: a hung or overloaded broker, not this
		// message (the relay's breaker opens when it happens across
		// keys; a lone key's counts its attempt).
		return sinks.Unavailable(fmt.Errorf("%w within the publish timeout: %w", ErrNoPuback, ctx.Err()))
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrNoPuback, ctx.Err())
	case pctx.Err() != nil:
		// The PUBLISH went out and the broker's connection dropped
		// before its answer: the broker may have the message, and a
		// dropped connection says the broker, not the message, failed.
		return sinks.Unavailable(fmt.Errorf("%w: the connection dropped before it came", ErrNoPuback))
	}
	return fmt.Errorf("outbox: mqtt: publish: %w", err)
}

// prepare builds the PUBLISH, refusing what the broker can never accept.
func (s *Sink) prepare(m sinks.Message, maxPacket uint32) (*paho.Publish, error) {
	topic := s.topic.Render(m.Topic, m.Key, m.Headers)
	if err := checkTopic(topic); err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrBadTopic, topic, err)
	}
	props := &paho.PublishProperties{User: make(paho.UserProperties, 0, len(m.Headers)+3)}
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // the same packet for the same message
	for _, k := range names {
		v := m.Headers[k]
		switch {
		case k == PropID || k == PropSeq || k == PropKey:
			continue // the sink's own
		case strings.EqualFold(k, HeaderContentType):
			props.ContentType = v
			continue
		}
		props.User = append(props.User, paho.UserProperty{Key: k, Value: v})
	}
	props.User = append(props.User,
		paho.UserProperty{Key: PropID, Value: m.ID},
		paho.UserProperty{Key: PropSeq, Value: strconv.FormatInt(m.Seq, 10)})
	if m.Key != "" {
		props.User = append(props.User, paho.UserProperty{Key: PropKey, Value: m.Key})
	}
	for _, u := range props.User {
		if err := checkString(u.Key); err != nil {
			return nil, fmt.Errorf("outbox: mqtt: header name %q: %w", u.Key, err)
		}
		if err := checkString(u.Value); err != nil {
			return nil, fmt.Errorf("outbox: mqtt: header %q: value %w", u.Key, err)
		}
	}
	if err := checkString(props.ContentType); err != nil {
		return nil, fmt.Errorf("outbox: mqtt: content-type: %w", err)
	}
	p := &paho.Publish{QoS: 1, Topic: topic, Payload: m.Payload, Properties: props}
	if size := packetSize(p); maxPacket > 0 && size > int(maxPacket) {
		return nil, fmt.Errorf("%w: the PUBLISH packet is %d bytes (payload %d), over the broker's Maximum Packet Size of %d",
			ErrTooLarge, size, len(m.Payload), maxPacket)
	} else if size > maxMQTTPacket {
		return nil, fmt.Errorf("%w: the PUBLISH packet is %d bytes, over MQTT's limit of %d", ErrTooLarge, size, maxMQTTPacket)
	}
	return p, nil
}

// checkTopic refuses a topic name the broker must refuse (MQTT 5,
// 4.7.3 and 1.5.4): empty, a wildcard, NUL, not UTF-8, too long.
func checkTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty")
	case strings.ContainsAny(t, "+#"):
		return errors.New("has a wildcard ('+' or '#'), which only subscriptions may use")
	}
	return checkString(t)
}

// checkString checks an MQTT UTF-8 string (1.5.4).
func checkString(v string) error {
	switch {
	case len(v) > 65535:
		return fmt.Errorf("is %d bytes, over MQTT's 65535", len(v))
	case !utf8.ValidString(v):
		return errors.New("is not valid UTF-8")
	case strings.ContainsRune(v, 0):
		return errors.New("contains NUL")
	}
	return nil
}

// maxMQTTPacket is the largest packet MQTT can encode: a remaining
// length of at most 268,435,455 plus the fixed header.
const maxMQTTPacket = 268435455 + 5

// packetSize is the encoded size of a QoS 1 PUBLISH of p (fixed header,
// topic, packet id, properties, payload), as the broker measures it
// against its Maximum Packet Size.
func packetSize(p *paho.Publish) int {
	props := 0
	if p.Properties != nil {
		if p.Properties.ContentType != "" {
			props += 1 + 2 + len(p.Properties.ContentType)
		}
		for _, u := range p.Properties.User {
			props += 1 + 2 + len(u.Key) + 2 + len(u.Value)
		}
	}
	remaining := 2 + len(p.Topic) + 2 + varintLen(props) + props + len(p.Payload)
	return 1 + varintLen(remaining) + remaining
}

func varintLen(n int) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	}
	return 4
}
