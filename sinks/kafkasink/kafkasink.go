// Package kafkasink publishes outbox messages to Apache Kafka with
// segmentio/kafka-go.
//
// Each outbox message becomes one Kafka record: key = outbox key (null when
// the message has none), value = payload byte for byte, headers = the
// outbox-message-id and outbox-seq headers followed by the application
// headers in key order, timestamp = the message's created_at (the database's clock, never
// the relay host's). Records are produced with acks=all and partitioned by
// a key hash (murmur2 by default, like the Java client).
//
// The sink talks to the brokers through kafka-go's Transport and builds the
// produce requests itself instead of using kafka.Writer; see Send for why.
// It is an idempotent producer (kafka-go has none): it encodes its own
// record batches, with a producer id, epoch and sequence numbers, and
// resends a batch whose outcome is unknown unchanged, so the broker
// appends it once (see Send, batch.go and idempotence.go).
// What lives elsewhere: retries and their backoff (the relay persists them
// in the outbox row), dead-lettering (the relay), consumers (not our job).
package kafkasink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// HeaderMessageID is the record header carrying the stable message id
// (sinks.Message.ID). It is the same on every delivery attempt and after a
// dead-letter replay, so consumers deduplicate on it. It is always the first
// header; an application header with the same name is dropped.
const HeaderMessageID = wire.MessageID

// HeaderSeq is the record header carrying the message's position
// (sinks.Message.Seq, the outbox row's id) in decimal. A key's messages
// carry growing positions in the order they were written; consumers (the
// inbox package) use it to tell a late redelivery from a new message. It is
// always the second header; an application header with the same name is
// dropped.
const HeaderSeq = wire.Seq

// Kafka's record batch v2 framing, before the first record: base offset (8),
// length (4), leader epoch (4), magic (1), crc (4), attributes (2), last
// offset delta (4), first and max timestamp (16), producer id (8), producer
// epoch (2), base sequence (4), record count (4).
const recordBatchOverhead = 61

// maxRequestBytes caps one produce request. Partition batches bound for the
// same broker share a request up to this size; the cap stays well below the
// brokers' socket.request.max.bytes (100 MiB by default), which would
// otherwise drop the connection on a wave of many full partitions.
const maxRequestBytes = 32 << 20

// Sink publishes to Kafka. It implements sinks.Sink and sinks.HealthChecker.
type Sink struct {
	cfg       Config
	log       *slog.Logger
	addr      net.Addr
	tls       *tls.Config
	sasl      sasl.Mechanism
	balancer  kafka.Balancer
	transport *kafka.Transport
	// producer is the idempotent producer; nil with idempotent=false.
	producer *producer
	// now reads the relay host's wall clock. Tests replace it to play a
	// host whose clock is off.
	now func() time.Time

	inflight sinks.Inflight
}

// New validates cfg, applies defaults and returns a sink. It does not
// connect: the first Send (or Healthy) does.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mech, err := cfg.saslMechanism()
	if err != nil {
		return nil, err
	}
	s := &Sink{
		cfg:      cfg,
		log:      logger.With("sink", "kafka"),
		addr:     kafka.TCP(cfg.Brokers...),
		tls:      tc,
		sasl:     mech,
		balancer: cfg.balancer(),
		now:      time.Now,
	}
	s.transport = s.newTransport(nil)
	if mode := cfg.idempotence(); mode != idempotenceOff {
		client := &kafka.Client{Addr: s.addr, Transport: s.transport, Timeout: cfg.WriteTimeout}
		s.producer = newProducer(mode, s.log, client)
	}
	return s, nil
}

// Config returns the configuration in use, defaults applied.
func (s *Sink) Config() Config { return s.cfg }

// KafkaTopic returns the Kafka topic an outbox topic is published to.
func (s *Sink) KafkaTopic(topic string) string { return s.cfg.kafkaTopic(topic) }

func (s *Sink) newTransport(metadataTopics []string) *kafka.Transport {
	return &kafka.Transport{
		Dial:           (&net.Dialer{Timeout: s.cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		DialTimeout:    s.cfg.DialTimeout,
		MetadataTTL:    s.cfg.MetadataTTL,
		MetadataTopics: metadataTopics,
		ClientID:       s.cfg.ClientID,
		TLS:            s.tls,
		SASL:           s.sasl,
	}
}

// Close waits for in-flight Sends (or ctx) and closes every connection.
// Later Sends return sinks.ErrClosed. Close is idempotent. There is nothing
// to flush: the sink buffers nothing between Sends.
func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	if err != nil {
		err = fmt.Errorf("outbox: kafka: close: in-flight sends did not finish: %w", err)
	}
	s.transport.CloseIdleConnections()
	return err
}

// Healthy makes one round trip (ApiVersions) to a bootstrap broker. A
// connection found dead (the broker restarted since it was opened) is
// dropped and the round trip tried once more on a new one, so a restarted
// but healthy cluster does not read as down.
func (s *Sink) Healthy(ctx context.Context) error {
	if !s.inflight.Enter() {
		return sinks.ErrClosed
	}
	defer s.inflight.Leave()
	client := &kafka.Client{Addr: s.addr, Transport: s.transport, Timeout: s.cfg.WriteTimeout}
	var err error
	for range 2 {
		var res *kafka.ApiVersionsResponse
		res, err = client.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("outbox: kafka: brokers %v unreachable: %w", s.cfg.Brokers, s.connErr(err))
	}
	return nil
}

// Send publishes msgs with as few produce requests as the batch allows:
// normally one request per partition leader.
//
// Why not kafka.Writer: the Writer cuts each partition's messages into
// batches of BatchSize/BatchBytes and writes them one after another from a
// per-partition goroutine, with in-process retries (MaxAttempts), and a
// batch that failed does not stop the next one. It also fills a partition's
// current batch with messages from concurrent WriteMessages calls, so even
// a Send whose messages fit one batch can be split in two wherever another
// Send's messages left the current batch. A split plus a failed first half
// delivers later messages of a key after an earlier one failed: the per-key
// contract forbids exactly that. Serialising every WriteMessages and setting
// BatchSize/BatchBytes to cover a whole Send would avoid the split but
// serialises all Sends and still waits BatchTimeout on every call.
//
// What this does instead, per Send:
//
//  1. Every message is checked locally first: topic name and the estimated
//     encoded size against max_message_bytes (too big => permanent, no round
//     trip). Partition counts and leaders come from kafka-go's metadata
//     cache (refreshed every metadata_ttl); a topic the cache does not know
//     is looked up fresh before it is declared missing.
//  2. Each message gets a partition (key hash) and a wave. A wave holds at
//     most one record batch per partition, each at most max_message_bytes.
//     A message goes to the same wave as the previous message of its key
//     when both are on the same partition and the batch has room, else to a
//     later wave; so within a wave a key lives in exactly one batch, in
//     slice order, and a key's messages in later waves come after it.
//     Nearly every Send is one wave.
//  3. A wave is sent as one produce request per leader broker (acks=all),
//     all leaders concurrently. Kafka appends a partition's record batch
//     atomically: all of its records or none. So a failed batch never
//     leaves a later record of a key delivered after an earlier one of the
//     same key failed; every message in it gets the batch's error (not
//     ErrNotAttempted: they were on the wire, and after a timeout they may
//     even have been appended).
//  4. Before the next wave, messages whose key failed in an earlier wave
//     (or locally) are removed and reported as sinks.ErrNotAttempted: they
//     never went on the wire, so they were certainly not delivered.
//  5. A multi-record batch rejected as a whole with a permanent code
//     (MESSAGE_TOO_LARGE when the broker's limit is below
//     max_message_bytes, INVALID_RECORD, ...) is split in two halves sent
//     one after the other, recursively, so only the offending record is
//     reported permanent. The halves keep slice order and the key gate.
//
// The relay persists retries with backoff and holds later messages of a
// failing key, which is exactly the ordering rule; the sink retries
// nothing whose failure is known (an in-process retry would also hit the
// same stale leader until the metadata cache refreshes).
//
// An unknown outcome is another matter: a request without an answer (its
// connection broke, write_timeout passed) or answered REQUEST_TIMED_OUT
// may have been appended. kafka-go has no idempotent producer, so the sink
// is one (Config.Idempotent, on by default where the brokers support it):
// a producer id from InitProducerId, once per Sink, and per partition a
// sequence number in every record batch, which the broker uses to drop a
// batch it already appended. A batch whose outcome is unknown is resent
// by the sink, byte for byte, within the same Send, for up to twice
// metadata_ttl (see resend); only if it is still unanswered then does
// the Send report it unavailable, and the producer moves to a new epoch,
// so that the relay's retry may append it a second time. Consumers still
// deduplicate on HeaderMessageID: for that case, for a relay that
// crashed, and for the rows another relay delivers again (every Sink has
// its own producer id). Requests to one partition go one at a time (see
// producer): within a Send a wave holds one batch per partition, and
// concurrent Sends take turns, except that a partition whose batch is
// being resent takes none: its messages are not sent (see lease.take).
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.Guard(ctx, msgs, "outbox: kafka: send", s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	gate := keyGate{}
	waves, err := s.plan(ctx, msgs, be, gate)
	if err != nil {
		return err
	}
	clk := sendClock{start: time.Now(), hostNow: s.now}
	for w, groups := range waves {
		if err := ctx.Err(); err != nil {
			cut := fmt.Errorf("outbox: kafka: not sent: %w", err)
			for _, rest := range waves[w:] {
				for _, g := range rest {
					for _, i := range g.idx {
						be.Errs[i] = cut
					}
				}
			}
			break
		}
		live := groups[:0]
		for _, g := range groups {
			kept := g.idx[:0]
			for _, i := range g.idx {
				if gate.blocked(msgs, i) {
					be.Errs[i] = sinks.ErrNotAttempted
					continue
				}
				kept = append(kept, i)
			}
			if g.idx = kept; len(kept) > 0 {
				live = append(live, g)
			}
		}
		s.produceWave(ctx, msgs, live, clk, be)
		for _, g := range live {
			for _, i := range g.idx {
				if be.Errs[i] != nil {
					gate.fail(msgs, i)
				}
			}
		}
	}
	return be.Err()
}

// sendClock stamps the records of one Send.
type sendClock struct {
	start   time.Time        // when Send began (for its monotonic reading)
	hostNow func() time.Time // the relay host's wall clock
}

// sent is the best estimate of the current time for m: the database's
// clock at claim plus the time since Send began. Only a message without
// ClaimedAt (a caller other than the relay) gets the host's clock, which
// may be off.
func (c sendClock) sent(m *sinks.Message) time.Time {
	if m.ClaimedAt.IsZero() {
		return c.hostNow()
	}
	return m.ClaimedAt.Add(time.Since(c.start))
}

// created is m's record timestamp: its creation time on the database
// clock (CreateTime semantics), or the send time when it has none.
func (c sendClock) created(m *sinks.Message) time.Time {
	if m.CreatedAt.IsZero() {
		return c.sent(m)
	}
	return m.CreatedAt
}

// keyGate remembers, per key, the position of the first message that
// failed. Unlike sinks.KeyGate it is positional: plan fails messages before
// the waves send the earlier messages of the same key, and only messages
// after the failure may be held back.
type keyGate map[string]int

func (g keyGate) blocked(msgs []sinks.Message, i int) bool {
	j, ok := g[msgs[i].Key]
	return ok && msgs[i].Key != "" && j < i
}

func (g keyGate) fail(msgs []sinks.Message, i int) {
	k := msgs[i].Key
	if k == "" {
		return
	}
	if j, ok := g[k]; !ok || i < j {
		g[k] = i
	}
}

type topicPartition struct {
	topic     string
	partition int32
}

// group is one record batch: the messages of one Send bound for one
// partition in one wave, in slice order.
type group struct {
	tp     topicPartition
	leader int32
	idx    []int
	bytes  int
}

type topicMeta struct {
	partitions []int   // 0..n-1, as kafka.Balancer wants them
	leaders    []int32 // by partition; -1 when the partition has no leader
	err        error   // every message for this topic fails with it
}

// plan validates msgs, assigns partitions and splits the batch into waves
// (see Send). Messages that fail here get their error in be, and later
// messages of their key get ErrNotAttempted.
func (s *Sink) plan(ctx context.Context, msgs []sinks.Message, be *sinks.BatchError, gate keyGate) ([][]*group, error) {
	c := s.check(msgs)
	var metas map[string]*topicMeta
	if len(c.distinct) > 0 {
		var err error
		if metas, err = s.resolveTopics(ctx, c.distinct); err != nil {
			return nil, err
		}
	}
	w := waves{maxBytes: s.cfg.MaxMessageBytes, groups: map[slot]*group{}, last: map[string]slot{}}
	for i := range msgs {
		if gate.blocked(msgs, i) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		tp, leader, err := s.partition(&msgs[i], c.topics[i], c.local[i], metas)
		if err != nil {
			be.Errs[i] = err
			gate.fail(msgs, i)
			continue
		}
		w.place(i, msgs[i].Key, tp, leader, c.sizes[i])
	}
	return w.waves, nil
}

// checked is what plan learns of each message before asking the
// brokers.
type checked struct {
	topics   []string // each message's Kafka topic
	sizes    []int    // each message's estimated encoded size
	local    []error  // why a message fails without a round trip, or nil
	distinct []string // the topics to ask about, each once
}

// check maps each message to its Kafka topic and fails, without a round
// trip, those with an invalid topic or above max_message_bytes.
func (s *Sink) check(msgs []sinks.Message) checked {
	c := checked{topics: make([]string, len(msgs)), sizes: make([]int, len(msgs)), local: make([]error, len(msgs))}
	seen := map[string]bool{}
	for i := range msgs {
		m := &msgs[i]
		t := s.cfg.kafkaTopic(m.Topic)
		c.topics[i] = t
		if err := validTopicName(t, false); err != nil {
			c.local[i] = sinks.Permanent(fmt.Errorf("outbox: kafka: outbox topic %q: %w: %w", m.Topic, err, kafka.InvalidTopic))
			continue
		}
		c.sizes[i] = recordSize(m)
		if n := recordBatchOverhead + c.sizes[i]; n > s.cfg.MaxMessageBytes {
			c.local[i] = sinks.Permanent(fmt.Errorf("outbox: kafka: message is about %d bytes encoded, above max_message_bytes %d: %w", n, s.cfg.MaxMessageBytes, kafka.MessageSizeTooLarge))
			continue
		}
		if !seen[t] {
			seen[t] = true
			c.distinct = append(c.distinct, t)
		}
	}
	return c
}

// partition returns the partition of m (in topic) and its leader, or the
// error m fails with: err, the one check found, or its topic's, or a
// partition without a leader.
func (s *Sink) partition(m *sinks.Message, topic string, err error, metas map[string]*topicMeta) (topicPartition, int32, error) {
	if err != nil {
		return topicPartition{}, 0, err
	}
	tm := metas[topic]
	if tm.err != nil {
		return topicPartition{}, 0, tm.err
	}
	var key []byte
	if m.Key != "" {
		key = []byte(m.Key)
	}
	p := int32(s.balancer.Balance(kafka.Message{Key: key}, tm.partitions...))
	if tm.leaders[p] < 0 {
		return topicPartition{}, 0, sinks.Unavailable(fmt.Errorf("outbox: kafka: %s[%d] has no leader: %w", topic, p, kafka.LeaderNotAvailable))
	}
	return topicPartition{topic, p}, tm.leaders[p], nil
}

// slot is a partition in one wave.
type slot struct {
	tp   topicPartition
	wave int
}

// waves splits a batch into waves of record batches, one group per
// partition and wave (see Send).
type waves struct {
	maxBytes int
	waves    [][]*group
	groups   map[slot]*group
	last     map[string]slot // where each key's latest message went
}

// place puts message i, of key and size, in the first wave that keeps
// its key's order and has room in its partition's group: the wave of the
// key's previous message, the next one when that went to another
// partition (never in flight together), or later when the group is full.
func (w *waves) place(i int, key string, tp topicPartition, leader int32, size int) {
	n := 0
	if key != "" {
		if prev, ok := w.last[key]; ok {
			n = prev.wave
			if prev.tp != tp {
				n++
			}
		}
	}
	for {
		g := w.groups[slot{tp, n}]
		if g == nil {
			g = &group{tp: tp, leader: leader}
			w.groups[slot{tp, n}] = g
			for len(w.waves) <= n {
				w.waves = append(w.waves, nil)
			}
			w.waves[n] = append(w.waves[n], g)
		}
		if len(g.idx) == 0 || recordBatchOverhead+g.bytes+size <= w.maxBytes {
			g.idx = append(g.idx, i)
			g.bytes += size
			break
		}
		n++
	}
	if key != "" {
		w.last[key] = slot{tp, n}
	}
}

// resolveTopics returns partition counts and leaders for topics from
// kafka-go's metadata cache. The cache only refreshes every metadata_ttl, so
// a topic created since looks missing: before calling a topic missing
// (permanent when auto-creation is off) it is looked up on a fresh
// connection, and when it does exist the cache is refreshed.
func (s *Sink) resolveTopics(ctx context.Context, topics []string) (map[string]*topicMeta, error) {
	res, err := s.metadata(ctx, topics)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*topicMeta, len(topics))
	var unknown []string
	for i := range res.Topics {
		t := &res.Topics[i]
		if kafka.Error(t.ErrorCode) == kafka.UnknownTopicOrPartition {
			unknown = append(unknown, t.Name)
			continue
		}
		out[t.Name] = topicMetaFrom(t)
	}
	if len(unknown) > 0 {
		s.resolveUnknown(ctx, unknown, out)
	}
	for _, t := range topics {
		if out[t] == nil {
			out[t] = &topicMeta{err: fmt.Errorf("outbox: kafka: no metadata for topic %q: %w", t, kafka.UnknownTopicOrPartition)}
		}
	}
	return out, nil
}

func (s *Sink) resolveUnknown(ctx context.Context, unknown []string, out map[string]*topicMeta) {
	if s.cfg.AllowAutoTopicCreation {
		// The metadata request asked the broker to create them; it did not
		// (yet). Creation may be in progress, or refused by the brokers.
		for _, t := range unknown {
			out[t] = &topicMeta{err: fmt.Errorf("outbox: kafka: topic %q does not exist (auto-creation requested): %w", t, kafka.UnknownTopicOrPartition)}
		}
		return
	}
	fresh, err := s.freshMetadata(ctx, unknown)
	if err != nil {
		for _, t := range unknown {
			out[t] = &topicMeta{err: fmt.Errorf("outbox: kafka: topic %q: checking whether it exists: %w", t, err)}
		}
		return
	}
	var exist []string
	for i := range fresh.Topics {
		t := &fresh.Topics[i]
		switch kafka.Error(t.ErrorCode) {
		case kafka.UnknownTopicOrPartition:
			out[t.Name] = &topicMeta{err: sinks.Permanent(fmt.Errorf("outbox: kafka: topic %q does not exist and allow_auto_topic_creation is off: %w", t.Name, kafka.UnknownTopicOrPartition))}
		default:
			exist = append(exist, t.Name)
		}
	}
	if len(exist) == 0 {
		return
	}
	s.log.DebugContext(ctx, "kafka: topics missing from the metadata cache exist; refreshing the cache", "topics", exist)
	if err := s.refreshCache(ctx, exist); err != nil {
		for _, t := range exist {
			out[t] = &topicMeta{err: fmt.Errorf("outbox: kafka: topic %q exists but the metadata cache did not refresh: %w", t, err)}
		}
		return
	}
	res, err := s.metadata(ctx, exist)
	if err != nil {
		for _, t := range exist {
			out[t] = &topicMeta{err: err}
		}
		return
	}
	for i := range res.Topics {
		t := &res.Topics[i]
		out[t.Name] = topicMetaFrom(t)
	}
}

func topicMetaFrom(t *meta.ResponseTopic) *topicMeta {
	if t.ErrorCode != 0 {
		err := fmt.Errorf("outbox: kafka: metadata for topic %q: %w", t.Name, kafka.Error(t.ErrorCode))
		return &topicMeta{err: classify(err)}
	}
	if len(t.Partitions) == 0 {
		return &topicMeta{err: fmt.Errorf("outbox: kafka: topic %q has no partitions: %w", t.Name, kafka.LeaderNotAvailable)}
	}
	tm := &topicMeta{partitions: make([]int, len(t.Partitions)), leaders: make([]int32, len(t.Partitions))}
	for i := range tm.leaders {
		tm.partitions[i] = i
		tm.leaders[i] = -1
	}
	for _, p := range t.Partitions {
		if p.PartitionIndex >= 0 && int(p.PartitionIndex) < len(tm.leaders) {
			tm.leaders[p.PartitionIndex] = p.LeaderID
		}
	}
	return tm
}

// metadata is served from the transport's cache (no round trip once the
// cluster layout is known).
func (s *Sink) metadata(ctx context.Context, topics []string) (*meta.Response, error) {
	r, err := s.transport.RoundTrip(ctx, s.addr, &meta.Request{TopicNames: topics, AllowAutoTopicCreation: s.cfg.AllowAutoTopicCreation})
	if err != nil {
		return nil, s.metadataErr(err)
	}
	return r.(*meta.Response), nil
}

// freshMetadata asks a broker, bypassing the cache: a short-lived transport
// whose first metadata request is a real one, for these topics only, with
// auto-creation off.
func (s *Sink) freshMetadata(ctx context.Context, topics []string) (*meta.Response, error) {
	t := s.newTransport(topics)
	defer t.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	r, err := t.RoundTrip(ctx, s.addr, &meta.Request{TopicNames: topics})
	if err != nil {
		return nil, s.metadataErr(err)
	}
	return r.(*meta.Response), nil
}

// metadataErr describes a metadata request that failed. No produce
// request went out before it, so it is not sent (see notSent),
// whatever its cause: a broker that cannot be dialled, a TLS handshake or a
// SASL exchange that fails, a connection that breaks, a deadline.
func (s *Sink) metadataErr(err error) error {
	return sinks.NotSent(fmt.Errorf("outbox: kafka: metadata from %v: %w", s.cfg.Brokers, s.connErr(err)))
}

// connErr makes a transport error readable: a SASL answer of the broker
// becomes an *AuthError naming the mechanism and user, and with SASL on a
// connection closed by the broker says what that usually means (a broker
// that answers SaslAuthenticate v0, or kfake, refuses credentials by
// closing the connection).
func (s *Sink) connErr(err error) error {
	if s.sasl == nil {
		return err
	}
	err = authErr(err, s.cfg.SASL.who())
	var ae *AuthError
	if !errors.As(err, &ae) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return fmt.Errorf("%w (the broker closed the connection: if it did so while authenticating, it refused the credentials; check %s)", err, s.cfg.SASL.who())
	}
	return err
}

// refreshCache makes the transport reload its cluster layout and waits until
// topics (known to exist) appear in it. kafka-go refreshes early only after
// a metadata request that allows auto-creation of a topic the cache lacks;
// the topics exist, so nothing is created. (If one were deleted in the
// instant between the fresh lookup and this call, a broker allowing
// auto-creation would create it: an accepted, tiny window.)
func (s *Sink) refreshCache(ctx context.Context, topics []string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	_, err := s.transport.RoundTrip(ctx, s.addr, &meta.Request{TopicNames: topics, AllowAutoTopicCreation: true})
	if err == nil {
		err = ctx.Err() // kafka-go gives up waiting silently
	}
	return err
}

// produceWave sends the groups of one wave, one request per leader broker
// (split at maxRequestBytes), concurrently, and records each message's
// outcome in be.
func (s *Sink) produceWave(ctx context.Context, msgs []sinks.Message, groups []*group, clk sendClock, be *sinks.BatchError) {
	if len(groups) == 0 {
		return
	}
	byLeader := map[int32][]*group{}
	var leaders []int32
	for _, g := range groups {
		if _, ok := byLeader[g.leader]; !ok {
			leaders = append(leaders, g.leader)
		}
		byLeader[g.leader] = append(byLeader[g.leader], g)
	}
	var reqs [][]*group
	for _, l := range leaders {
		var cur []*group
		size := 0
		for _, g := range byLeader[l] {
			if len(cur) > 0 && size+g.bytes > maxRequestBytes {
				reqs = append(reqs, cur)
				cur, size = nil, 0
			}
			cur = append(cur, g)
			size += g.bytes
		}
		reqs = append(reqs, cur)
	}

	errs := make([][]error, len(reqs))
	var wg sync.WaitGroup
	for r, gs := range reqs {
		wg.Go(func() { errs[r] = s.produce(ctx, msgs, gs, clk.created) })
	}
	wg.Wait()

	for r, gs := range reqs {
		for j, g := range gs {
			if err := errs[r][j]; err != nil {
				wg.Go(func() { s.failed(ctx, msgs, g, err, clk, be) })
			}
		}
	}
	wg.Wait()
}

// failed settles group g, whose record batch the broker refused with err.
//
// INVALID_TIMESTAMP refuses the records' creation times: the topic limits
// how far a timestamp may be from the broker's clock
// (log.message.timestamp.before.max.ms and after.max.ms) and the backlog
// is older, or the database's clock is off. Nothing was appended (a
// partition's batch is atomic), so the batch is sent once more stamped
// with the send time on the database clock.
//
// A batch the broker refused for the idempotent producer's state
// (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, a fenced epoch) was
// not appended either; the producer has moved on (a new epoch or id), and
// the batch is sent once more under it.
//
// A multi-record batch refused as a whole for something one record (or
// the batch size) causes is resent by halves to find the offending
// records. Any other error is the outcome of every message in g.
//
// Each of these sends comes before the next wave, so a key's later
// messages still wait for the outcome.
func (s *Sink) failed(ctx context.Context, msgs []sinks.Message, g *group, err error, clk sendClock, be *sinks.BatchError) {
	stamp := clk.created
	if producerStateReset(err) != resetNone {
		if err = s.produce(ctx, msgs, []*group{g}, stamp)[0]; err == nil {
			return
		}
	}
	if errors.Is(err, kafka.InvalidTimestamp) && hasCreatedAt(msgs, g.idx) {
		s.log.WarnContext(ctx, "kafka: broker refused the records' creation times; sending them again stamped with the send time",
			"topic", g.tp.topic, "partition", g.tp.partition, "messages", len(g.idx), "error", err)
		stamp = clk.sent
		if err = s.produce(ctx, msgs, []*group{g}, stamp)[0]; err == nil {
			return
		}
	}
	if len(g.idx) > 1 && isPermanentCode(err) {
		s.log.WarnContext(ctx, "kafka: record batch rejected as a whole; resending it in halves to find the offending records",
			"topic", g.tp.topic, "partition", g.tp.partition, "messages", len(g.idx), "error", err)
		var gate sinks.KeyGate
		mid := len(g.idx) / 2
		s.sendHalves(ctx, msgs, g, g.idx[:mid], &gate, stamp, be)
		s.sendHalves(ctx, msgs, g, g.idx[mid:], &gate, stamp, be)
		return
	}
	err = classify(err)
	for _, i := range g.idx {
		be.Errs[i] = err
	}
}

func hasCreatedAt(msgs []sinks.Message, idx []int) bool {
	for _, i := range idx {
		if !msgs[i].CreatedAt.IsZero() {
			return true
		}
	}
	return false
}

// sendHalves produces idx (a slice-ordered part of g) as one batch; when the
// batch is rejected permanently as a whole it recurses on both halves, in
// order. gate carries key failures from the earlier halves.
func (s *Sink) sendHalves(ctx context.Context, msgs []sinks.Message, g *group, idx []int, gate *sinks.KeyGate, stamp func(*sinks.Message) time.Time, be *sinks.BatchError) {
	var kept []int
	for _, i := range idx {
		if gate.Blocked(msgs[i]) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		kept = append(kept, i)
	}
	if len(kept) == 0 {
		return
	}
	part := &group{tp: g.tp, leader: g.leader, idx: kept}
	err := s.produce(ctx, msgs, []*group{part}, stamp)[0]
	if err == nil {
		return
	}
	if len(kept) > 1 && isPermanentCode(err) {
		mid := len(kept) / 2
		s.sendHalves(ctx, msgs, g, kept[:mid], gate, stamp, be)
		s.sendHalves(ctx, msgs, g, kept[mid:], gate, stamp, be)
		return
	}
	err = classify(err)
	for _, i := range kept {
		be.Errs[i] = err
		gate.Fail(msgs[i])
	}
}

// produce sends groups (all led by one broker) in one produce request,
// each record stamped with stamp, and returns one error per group: nil when
// the broker appended its batch. With the idempotent producer on, see
// produceIdempotent; else the request is kafka-go's own.
func (s *Sink) produce(ctx context.Context, msgs []sinks.Message, groups []*group, stamp func(*sinks.Message) time.Time) []error {
	if s.producer != nil {
		tps := make([]topicPartition, len(groups))
		for j, g := range groups {
			tps[j] = g.tp
		}
		l, err := s.producer.acquire(ctx, tps)
		switch {
		case err != nil:
			return fill(len(groups), s.leaseErr(ctx, err))
		case l != nil:
			defer l.release()
			return s.produceIdempotent(ctx, l, msgs, groups, stamp)
		}
		// The brokers refused the idempotent producer: produce without.
	}
	req := &produce.Request{
		Acks:    int16(kafka.RequireAll),
		Timeout: int32(s.cfg.WriteTimeout / time.Millisecond),
	}
	topicIdx := map[string]int{}
	for _, g := range groups {
		ti, ok := topicIdx[g.tp.topic]
		if !ok {
			ti = len(req.Topics)
			topicIdx[g.tp.topic] = ti
			req.Topics = append(req.Topics, produce.RequestTopic{Topic: g.tp.topic})
		}
		records := make([]protocol.Record, len(g.idx))
		for j, i := range g.idx {
			records[j] = record(&msgs[i], stamp(&msgs[i]))
		}
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, produce.RequestPartition{
			Partition: g.tp.partition,
			RecordSet: protocol.RecordSet{Records: protocol.NewRecordReader(records...)},
		})
	}
	return s.exchange(ctx, req, groups)
}

// leaseErr describes why a produce request could not start: the producer
// has no id (InitProducerId failed or was refused), a partition is busy
// resending a batch, or ctx ended while it waited for its turn. Nothing
// was sent.
func (s *Sink) leaseErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return fmt.Errorf("outbox: kafka: not sent: %w", err)
	case sinks.IsNotSent(err):
		return err
	}
	return sinks.NotSent(s.connErr(err))
}

func fill(n int, err error) []error {
	errs := make([]error, n)
	for j := range errs {
		errs[j] = err
	}
	return errs
}

// exchange sends req, a produce request for groups, and returns one error
// per group: nil when the broker appended its batch, or answered
// DUPLICATE_SEQUENCE_NUMBER (it had appended it before).
func (s *Sink) exchange(ctx context.Context, req kafka.Request, groups []*group) []error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	r, err := s.transport.RoundTrip(rctx, s.addr, req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("%w (write_timeout %s)", err, s.cfg.WriteTimeout)
		}
		err = notSent(fmt.Errorf("outbox: kafka: produce request to broker %d: %w", groups[0].leader, authErr(err, s.cfg.SASL.who())))
		if !sinks.IsNotSent(err) && ctx.Err() == nil {
			// The request may have gone out, and the broker did not
			// answer: its connection broke, or write_timeout passed.
			err = sinks.Unavailable(err)
		}
		return fill(len(groups), err)
	}
	res := r.(*produce.Response)
	type result struct {
		code int16
		msg  string
	}
	got := map[topicPartition]result{}
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			msg := p.ErrorMessage
			for _, re := range p.RecordErrors {
				msg += fmt.Sprintf("; record %d: %s", re.BatchIndex, re.BatchIndexErrorMessage)
			}
			got[topicPartition{t.Topic, p.Partition}] = result{p.ErrorCode, msg}
		}
	}
	errs := make([]error, len(groups))
	for j, g := range groups {
		res, ok := got[g.tp]
		switch {
		case !ok:
			errs[j] = fmt.Errorf("outbox: kafka: produce to %s[%d]: the broker's response does not mention the partition", g.tp.topic, g.tp.partition)
		case res.code != 0 && kafka.Error(res.code) != kafka.DuplicateSequenceNumber:
			errs[j] = produceError(g.tp.topic, g.tp.partition, res.code, res.msg)
		}
	}
	return errs
}

// record converts m, stamped with ts (never zero: kafka-go would put the
// host's clock in its place). The value is never null, even for an empty
// payload: a null value is a tombstone on compacted topics.
func record(m *sinks.Message, ts time.Time) protocol.Record {
	r := protocol.Record{Time: ts}
	if m.Key != "" {
		r.Key = protocol.NewBytes([]byte(m.Key))
	}
	v := m.Payload
	if v == nil {
		v = []byte{}
	}
	r.Value = protocol.NewBytes(v)
	r.Headers = recordHeaders(m)
	return r
}

func sortedKeys(h map[string]string) []string {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// recordSize is an upper bound of m's encoded size in a v2 record batch:
// each varint counted at its widest (length 5, timestamp delta 10, offset
// delta 5 bytes).
func recordSize(m *sinks.Message) int {
	n := 5 + 1 + 10 + 5 // length, attributes, timestamp delta, offset delta
	n += 5 + len(m.Key) + 5 + len(m.Payload) + 5
	n += 5 + len(HeaderMessageID) + 5 + len(m.ID)
	n += 5 + len(HeaderSeq) + 5 + 20 // the widest int64 in decimal
	for k, v := range m.Headers {
		n += 5 + len(k) + 5 + len(v)
	}
	return n
}
