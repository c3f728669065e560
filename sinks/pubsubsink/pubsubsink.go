// Package pubsubsink publishes outbox messages to Google Cloud Pub/Sub.
//
// Each message becomes one Pub/Sub message: the payload is its data, byte
// for byte, and attributes carry the message id (outbox-id), its outbox
// position (outbox-seq), its key (outbox-key) and one attribute per
// header, under the header's name. The topic is a template, so each outbox
// topic may go to its own Pub/Sub topic.
//
// Order per key: the key is the message's ordering key, and the publisher
// runs with message ordering enabled, so Pub/Sub stores a key's messages in
// publish order and delivers them in that order to subscriptions with
// ordering enabled. The publisher sends one bundle at a time per ordering
// key; when a bundle fails, it pauses the key and fails every later
// message of the key without sending it (ErrPublishingPaused), which the
// sink reports as not attempted, as the contract asks. At the end of the
// Send the sink resumes each failed key, so that its next Send may try
// again and other keys are never held back by it. The publisher keeps
// order within one topic; a key whose messages go to several topics (a
// topic template with {header:NAME}) waits for its earlier messages'
// results before its first message to another topic is published.
//
// The client's own retries of Publish are off (the relay retries, with
// its backoff kept in the row). A Publish that failed as Unavailable while
// the sink had no live connection to the endpoint and its last dial had
// failed could not have been sent: it is reported as not attempted, so an
// unreachable endpoint costs the messages no attempts.
package pubsubsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrRefused is wrapped by the error of a message Pub/Sub refused.
	ErrRefused = errors.New("outbox: pubsub: refused")
	// ErrInvalid is wrapped by the (permanent) error of a message the sink
	// refused before sending, because Pub/Sub could never accept it.
	ErrInvalid = errors.New("outbox: pubsub: message not accepted by Pub/Sub")
)

// Sink publishes to Pub/Sub. It implements sinks.Sink and is safe for
// concurrent use.
type Sink struct {
	cfg      Config
	topic    sinkconf.Template
	client   *pubsub.Client
	dials    *dialState
	log      *slog.Logger
	inflight sinks.Inflight

	mu         sync.Mutex
	publishers map[string]*pubsub.Publisher
	closed     bool
}

// New returns a sink for cfg. It validates cfg and applies the defaults;
// the client connects in the background, on first use. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	topic, err := sinkconf.ParseTemplate(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("outbox: pubsub: topic: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	d := &dialState{}
	opts := []option.ClientOption{
		option.WithEndpoint(cfg.Endpoint),
		option.WithGRPCDialOption(grpc.WithContextDialer(d.dial)),
		// Redial on the sink's own backoff: gRPC's default grows to two
		// minutes, so after a long outage the endpoint could be back for
		// that long before a probe of the relay's breaker got through.
		option.WithGRPCDialOption(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: cfg.ReconnectInitial, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.ReconnectMax},
			// Zero would bound a dial by the current backoff delay (100 ms
			// at first): too short for a TLS handshake far away.
			MinConnectTimeout: minConnectTimeout,
		})),
	}
	if cfg.Insecure {
		opts = append(opts, option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	} else if cfg.CredentialsFile != "" {
		opts = append(opts, option.WithCredentialsFile(cfg.CredentialsFile)) //nolint:staticcheck // a service account key file is what users have
	}
	noRetry := gax.WithRetry(func() gax.Retryer { return never{} })
	client, err := pubsub.NewClientWithConfig(context.Background(), cfg.Project,
		&pubsub.ClientConfig{TopicAdminCallOptions: &vkit.TopicAdminCallOptions{Publish: []gax.CallOption{noRetry}}}, opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: pubsub: client: %w", err)
	}
	return &Sink{cfg: cfg, topic: topic, client: client, dials: d, log: logger.With("sink", "pubsub"),
		publishers: map[string]*pubsub.Publisher{}}, nil
}

// minConnectTimeout bounds one dial of the endpoint (gRPC's default).
const minConnectTimeout = 20 * time.Second

// never is a gax.Retryer that never retries.
type never struct{}

func (never) Retry(error) (time.Duration, bool) { return 0, false }

// publisher returns the topic's publisher, made on first use.
func (s *Sink) publisher(topic string) *pubsub.Publisher {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.publishers[topic]
	if !ok {
		p = s.client.Publisher(topic)
		p.EnableMessageOrdering = true
		p.PublishSettings.DelayThreshold = time.Millisecond // a Send waits for its results: bundle what it published at once
		p.PublishSettings.Timeout = s.cfg.PublishTimeout
		s.publishers[topic] = p
	}
	return p
}

// Close refuses new Sends, waits for in-flight ones or ctx, then stops
// the publishers and closes the client. It is idempotent.
func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for _, p := range s.publishers {
			p.Stop()
		}
		if cerr := s.client.Close(); cerr != nil {
			s.log.Debug("pubsub close", "err", cerr)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("outbox: pubsub: close: in-flight sends still running: %w", err)
	}
	return nil
}

// Send publishes msgs, each key's in order under its ordering key, and
// waits for every result. See sinks.Sink for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: pubsub", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	var gate sinks.KeyGate
	results := make([]*pubsub.PublishResult, len(msgs))
	pubs := make([]*pubsub.Publisher, len(msgs))
	paused := map[*pubsub.Publisher][]string{} // keys to resume
	// resolve waits for message i's result and records it.
	resolve := func(i int) {
		r := results[i]
		if r == nil {
			return
		}
		results[i] = nil
		if _, err := r.Get(ctx); err != nil {
			m := msgs[i]
			be.Errs[i] = s.classify(pubs[i].ID(), err)
			if m.Key != "" && !gate.Blocked(m) {
				paused[pubs[i]] = append(paused[pubs[i]], m.Key)
			}
			gate.Fail(m)
		}
	}
	// The publisher orders a key's messages, and stops them after a
	// failure, within one topic. A key whose messages go to several topics
	// waits for its earlier messages' results before it changes topic.
	pending := map[string][]int{} // key -> its published, unresolved messages
	lastTopic := map[string]string{}
	for i, m := range msgs {
		if gate.Blocked(m) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		topic := s.topic.Render(m.Topic, m.Key, m.Headers)
		pm, err := message(m, topic)
		if err != nil {
			be.Errs[i] = sinks.Permanent(err)
			gate.Fail(m)
			continue
		}
		if m.Key != "" {
			if last, ok := lastTopic[m.Key]; ok && last != topic {
				for _, j := range pending[m.Key] {
					resolve(j)
				}
				pending[m.Key] = pending[m.Key][:0]
				if gate.Blocked(m) {
					be.Errs[i] = sinks.ErrNotAttempted
					continue
				}
			}
			lastTopic[m.Key] = topic
			pending[m.Key] = append(pending[m.Key], i)
		}
		pubs[i] = s.publisher(topic)
		results[i] = pubs[i].Publish(ctx, pm)
	}
	for i := range msgs {
		resolve(i)
	}
	// The publisher paused each failed key; it stays paused until resumed,
	// which the next Send of the key needs.
	for p, keys := range paused {
		for _, k := range keys {
			p.ResumePublish(k)
		}
	}
	return be.Err()
}

// message builds m's Pub/Sub message for topic, or says why Pub/Sub could
// never take it.
func message(m sinks.Message, topic string) (*pubsub.Message, error) {
	if topic == "" {
		return nil, fmt.Errorf("%w: topic: the template renders an empty topic", ErrInvalid)
	}
	if len(m.Key) > MaxOrderingKey {
		return nil, fmt.Errorf("%w: the key is %d bytes, and an ordering key takes at most %d", ErrInvalid, len(m.Key), MaxOrderingKey)
	}
	n := 2 + len(m.Headers)
	if m.Key != "" {
		n++
	}
	if n > MaxAttributes {
		return nil, fmt.Errorf("%w: %d headers, and a message takes %d attributes of which the sink uses %d", ErrInvalid, len(m.Headers), MaxAttributes, n-len(m.Headers))
	}
	attrs := make(map[string]string, n)
	attrs[AttrID] = m.ID
	attrs[AttrSeq] = strconv.FormatInt(m.Seq, 10)
	if m.Key != "" {
		attrs[AttrKey] = m.Key
	}
	size := len(m.Payload) + len(m.Key) + len(AttrID) + len(m.ID) + len(AttrSeq) + len(attrs[AttrSeq]) + len(AttrKey) + len(m.Key)
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // the same error for the same message
	for _, k := range names {
		v := m.Headers[k]
		switch {
		case k == AttrID || k == AttrSeq || k == AttrKey:
			return nil, fmt.Errorf("%w: header %q: is one of the sink's own attributes", ErrInvalid, k)
		case k == "" || len(k) > MaxAttrKeyBytes:
			return nil, fmt.Errorf("%w: header %q: an attribute key has 1 to %d bytes", ErrInvalid, k, MaxAttrKeyBytes)
		case strings.HasPrefix(k, "goog"):
			return nil, fmt.Errorf("%w: header %q: an attribute key cannot start with \"goog\"", ErrInvalid, k)
		case len(v) > MaxAttrValueBytes:
			return nil, fmt.Errorf("%w: header %q: the value is %d bytes, and an attribute value takes at most %d", ErrInvalid, k, len(v), MaxAttrValueBytes)
		}
		attrs[k] = v
		size += len(k) + len(v)
	}
	if size > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes with its attributes, above Pub/Sub's %d", ErrInvalid, size, MaxMessageBytes)
	}
	return &pubsub.Message{Data: m.Payload, Attributes: attrs, OrderingKey: m.Key}, nil
}

// classify turns a publish result's error into the message's outcome: a
// message the publisher never sent (its key paused by an earlier failure)
// is not attempted; InvalidArgument and NotFound (no such topic) are
// permanent; Unavailable with no live connection and a failed last dial
// was not sent (sinks.NotSent); Unavailable on a live connection and
// DeadlineExceeded say the service as a whole did not answer
// (sinks.Unavailable); everything else is retried.
func (s *Sink) classify(topic string, err error) error {
	var paused pubsub.ErrPublishingPaused
	if errors.As(err, &paused) {
		return fmt.Errorf("outbox: pubsub: %s: %w (%w)", topic, sinks.ErrNotAttempted, err)
	}
	if errors.Is(err, pubsub.ErrOversizedMessage) {
		return sinks.Permanent(fmt.Errorf("%w: %s: %w", ErrInvalid, topic, err))
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("outbox: pubsub: %s: %w", topic, err)
	}
	e := fmt.Errorf("%w: %s: %s: %s", ErrRefused, topic, st.Code(), st.Message())
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound:
		return sinks.Permanent(e)
	case codes.Unavailable:
		if s.dials.unreachable() {
			return sinks.NotSent(fmt.Errorf("%w (no connection to %s)", e, s.cfg.Endpoint))
		}
		return sinks.Unavailable(e)
	case codes.DeadlineExceeded:
		return sinks.Unavailable(e)
	}
	return e
}

// dialState follows the client's connections: how many are open, and
// whether the last dial failed. With none open and the last dial failed,
// an RPC that failed as Unavailable was never sent.
type dialState struct {
	live   atomic.Int64
	failed atomic.Bool
	dials  atomic.Int64 // attempts, for tests
}

func (d *dialState) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.dials.Add(1)
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		d.failed.Store(true)
		return nil, err
	}
	d.failed.Store(false)
	d.live.Add(1)
	return &countedConn{Conn: c, d: d}, nil
}

func (d *dialState) unreachable() bool { return d.live.Load() == 0 && d.failed.Load() }

type countedConn struct {
	net.Conn
	d    *dialState
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.d.live.Add(-1) })
	return c.Conn.Close()
}
