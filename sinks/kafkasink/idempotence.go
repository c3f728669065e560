package kafkasink

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
	"golang.org/x/sync/semaphore"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// ErrIdempotenceRefused says that the brokers do not let the sink use
// Kafka's idempotent producer: they predate it (Kafka 0.11), or refuse
// InitProducerId (ACLs without IDEMPOTENT_WRITE on the cluster, or on
// Amazon MSK with IAM a role without kafka-cluster:WriteDataIdempotently).
// With idempotent unset the sink then produces without it (and logs a
// warning); with idempotent=true its Sends fail, not attempted, with an
// error that wraps this one.
var ErrIdempotenceRefused = errors.New("outbox: kafka: the brokers refuse the idempotent producer")

// producer is the sink's idempotent producer (see Sink.Send): its id and
// epoch, the next sequence number of every partition it wrote to, and
// the turns that keep one produce request per partition on the wire.
//
// Every produce request holds one unit of epochs while it is on the wire,
// resends included; changing the id or the epoch takes all of them, so
// no request of the old epoch is in flight when the sequences restart
// (a request of the old epoch arriving after the new one would be fenced
// by the broker, and could no longer learn whether it had been appended).
type producer struct {
	mode   idempotence
	log    *slog.Logger
	client *kafka.Client // its Timeout bounds each round trip
	epochs *semaphore.Weighted

	mu       sync.Mutex
	state    producerState
	reset    resetKind // what the next request must do first
	id       int64
	epoch    int16
	canBump  bool // the brokers accept a locally bumped epoch (KIP-360, Kafka 2.5)
	versions bool // the brokers' API versions were checked
	seqs     map[topicPartition]int32
	turns    map[topicPartition]chan struct{}
	// doubts are the partitions whose turn is held by a batch being
	// resent after an unknown outcome; doubted is closed (and replaced)
	// when one is added, to wake the requests waiting for a turn.
	doubts  map[topicPartition]bool
	doubted chan struct{}
}

type producerState int

const (
	producerUnknown producerState = iota // no id yet
	producerReady
	producerOff // the brokers refused it; produce without
)

// resetKind is how the producer must move on before its next request,
// weakest first.
type resetKind int

const (
	resetNone resetKind = iota
	// resetBump restarts every partition's sequence at 0 under a new
	// epoch: bumped locally where the brokers accept it, else a new id.
	resetBump
	// resetNewID asks the brokers for a new producer id.
	resetNewID
)

// allEpochs is the weight of epochs that changing the epoch takes.
const allEpochs = math.MaxInt32

func newProducer(mode idempotence, log *slog.Logger, client *kafka.Client) *producer {
	return &producer{
		mode:    mode,
		log:     log,
		client:  client,
		epochs:  semaphore.NewWeighted(allEpochs),
		seqs:    map[topicPartition]int32{},
		turns:   map[topicPartition]chan struct{}{},
		doubts:  map[topicPartition]bool{},
		doubted: make(chan struct{}),
	}
}

// lease is the right to send one produce request for some partitions with
// the producer's current id and epoch (see producer.acquire).
type lease struct {
	p       *producer
	id      int64
	epoch   int16
	held    []chan struct{}
	doubted []topicPartition // the partitions it resends a batch to
}

// acquire returns a lease for tps, after the producer has an id (the
// first request asks for one) and has moved on as a reset asked. It waits
// for the requests in flight to tps to finish. It returns a nil lease and
// no error when the producer is off (the brokers refused it).
func (p *producer) acquire(ctx context.Context, tps []topicPartition) (*lease, error) {
	for {
		if err := p.epochs.Acquire(ctx, 1); err != nil {
			return nil, err
		}
		p.mu.Lock()
		state, reset, id, epoch := p.state, p.reset, p.id, p.epoch
		p.mu.Unlock()
		if state == producerOff {
			p.epochs.Release(1)
			return nil, nil
		}
		if state == producerReady && reset == resetNone {
			l := &lease{p: p, id: id, epoch: epoch}
			err := l.take(ctx, tps)
			if err == nil && l.current() {
				return l, nil
			}
			l.release()
			if err != nil {
				return nil, err
			}
			continue // the epoch must change first: see current
		}
		p.epochs.Release(1)
		if err := p.reinit(ctx); err != nil {
			return nil, err
		}
	}
}

// take waits for the turn of each partition of tps, in one order for
// every caller (no two requests wait for each other's partitions). It
// does not wait for a partition whose batch is being resent after an
// unknown outcome (see resend): that takes seconds, and the partition
// cannot take another batch under this epoch anyway; the error, not
// sent, lets the relay back off as from a broker it cannot reach.
func (l *lease) take(ctx context.Context, tps []topicPartition) error {
	tps = slices.Clone(tps)
	slices.SortFunc(tps, func(a, b topicPartition) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	for _, tp := range tps {
		for taken := false; !taken; {
			l.p.mu.Lock()
			doubt := l.p.doubts[tp]
			turn := l.p.turns[tp]
			if turn == nil {
				turn = make(chan struct{}, 1)
				l.p.turns[tp] = turn
			}
			doubted := l.p.doubted
			l.p.mu.Unlock()
			if doubt {
				return sinks.NotSent(fmt.Errorf("outbox: kafka: %s[%d] is busy: its last record batch is being resent after an unknown outcome", tp.topic, tp.partition))
			}
			select {
			case turn <- struct{}{}:
				l.held = append(l.held, turn)
				taken = true
			case <-doubted: // look again
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// doubt marks tps, whose turns the lease holds, as resending a batch
// after an unknown outcome, until the lease is released.
func (l *lease) doubt(tps []topicPartition) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	for _, tp := range tps {
		l.p.doubts[tp] = true
	}
	l.doubted = append(l.doubted, tps...)
	close(l.p.doubted)
	l.p.doubted = make(chan struct{})
}

// current reports whether the lease's epoch may still carry new batches
// to its partitions, now that it holds their turns. A request that held
// one of them before may have left its batch's outcome unknown: the
// broker may hold that batch under the sequence number this lease would
// give the next one, and would take a batch of the same size for a
// duplicate and drop it. Such a request asks for a new epoch (resetNext)
// before it gives the turn back, so the flag is seen here.
func (l *lease) current() bool {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	return l.p.reset == resetNone
}

// release gives the partitions' turns and the epoch back.
func (l *lease) release() {
	l.p.mu.Lock()
	for _, tp := range l.doubted {
		delete(l.p.doubts, tp)
	}
	l.p.mu.Unlock()
	l.doubted = nil
	for _, turn := range l.held {
		<-turn
	}
	l.held = nil
	l.p.epochs.Release(1)
}

// fields returns the producer fields of the next batch to tp.
func (l *lease) fields(tp topicPartition) producerFields {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	return producerFields{id: l.id, epoch: l.epoch, seq: l.p.seqs[tp]}
}

// appended records that the broker appended n records to tp.
func (l *lease) appended(tp topicPartition, n int) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	l.p.seqs[tp] = nextSeq(l.p.seqs[tp], n)
}

// resetNext makes the producer move on (kind) before its next request.
func (l *lease) resetNext(kind resetKind) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	l.p.reset = max(l.p.reset, kind)
}

// reinit gives the producer an id, or moves it on as a reset asked, once
// no request is in flight.
func (p *producer) reinit(ctx context.Context) error {
	if err := p.epochs.Acquire(ctx, allEpochs); err != nil {
		return err
	}
	defer p.epochs.Release(allEpochs)
	p.mu.Lock()
	state, reset := p.state, p.reset
	// An epoch near its end (brokers treat 32767 as exhausted) takes a new id.
	bump := state == producerReady && reset == resetBump && p.canBump && p.epoch < math.MaxInt16-1
	if bump {
		p.epoch++
		p.seqs = map[topicPartition]int32{}
		p.reset = resetNone
		p.log.InfoContext(ctx, "kafka: idempotent producer: epoch bumped; sequences restart at 0", "producer_id", p.id, "epoch", p.epoch)
	}
	p.mu.Unlock()
	if bump || state == producerOff || (state == producerReady && reset == resetNone) {
		return nil // done here or by the request that reinit waited for
	}
	id, epoch, err := p.initProducerID(ctx)
	if errors.Is(err, ErrIdempotenceRefused) && p.mode == idempotenceAuto {
		p.mu.Lock()
		p.state = producerOff
		p.mu.Unlock()
		p.log.WarnContext(ctx, "kafka: producing without the idempotent producer: a record batch sent again after its answer was lost can be appended twice (set idempotent=false to say so and silence this warning)", "error", err)
		return nil
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.state, p.reset, p.id, p.epoch = producerReady, resetNone, id, epoch
	p.seqs = map[topicPartition]int32{}
	p.mu.Unlock()
	p.log.InfoContext(ctx, "kafka: idempotent producer ready", "producer_id", id, "epoch", epoch)
	return nil
}

// initProducerID asks the brokers for a new producer id (InitProducerId
// without a transactional id), after checking once that they support it.
// An answer that says to try again is retried up to initAttempts times;
// a refusal wraps ErrIdempotenceRefused.
func (p *producer) initProducerID(ctx context.Context) (int64, int16, error) {
	if err := p.checkVersions(ctx); err != nil {
		return 0, 0, err
	}
	var err error
	for attempt := range initAttempts {
		if attempt > 0 && !sleep(ctx, time.Duration(attempt)*100*time.Millisecond) {
			break
		}
		var res *kafka.InitProducerIDResponse
		res, err = p.initOnce(ctx)
		if err == nil && res.Error == nil {
			return int64(res.Producer.ProducerID), int16(res.Producer.ProducerEpoch), nil
		}
		if err != nil {
			break // the relay backs off and tries again
		}
		err = res.Error
		var ke kafka.Error
		if errors.As(err, &ke) {
			switch ke {
			case kafka.ClusterAuthorizationFailed, kafka.TransactionalIDAuthorizationFailed:
				return 0, 0, fmt.Errorf("%w: InitProducerId answered %w (grant the relay's principal IDEMPOTENT_WRITE on the cluster, or WRITE on the topics on Kafka 2.8 and later, or on Amazon MSK kafka-cluster:WriteDataIdempotently; or set idempotent=false)", ErrIdempotenceRefused, ke)
			case kafka.UnsupportedVersion:
				return 0, 0, fmt.Errorf("%w: InitProducerId answered %w; set idempotent=false", ErrIdempotenceRefused, ke)
			}
			if !ke.Temporary() {
				break
			}
		}
	}
	return 0, 0, fmt.Errorf("outbox: kafka: idempotent producer: InitProducerId: %w", err)
}

// initAttempts bounds InitProducerId answers that say to try again
// (a coordinator loading or moving).
const initAttempts = 3

func (p *producer) initOnce(ctx context.Context) (*kafka.InitProducerIDResponse, error) {
	rt := p.client.Transport
	if rt == nil {
		rt = kafka.DefaultTransport
	}
	m, err := rt.RoundTrip(ctx, p.client.Addr, &initPIDRequest{
		// The transactional id stays "": kafka-go sends it as null, the
		// idempotent producer's. Brokers ignore the timeout then.
		TransactionTimeoutMs: math.MaxInt32,
		ProducerID:           -1,
		ProducerEpoch:        -1,
	})
	if err != nil {
		return nil, err
	}
	r := m.(*initproducerid.Response)
	res := &kafka.InitProducerIDResponse{Producer: &kafka.ProducerSession{ProducerID: int(r.ProducerID), ProducerEpoch: int(r.ProducerEpoch)}}
	if r.ErrorCode != 0 {
		res.Error = kafka.Error(r.ErrorCode)
	}
	return res, nil
}

// initPIDRequest is InitProducerId as an idempotent producer sends it:
// without a transactional id, to any broker. kafka-go's own request type
// (protocol/initproducerid) is a transactional message, which its
// transport routes by sending a FindCoordinator for the transactional id
// "" first; on Kafka that lookup creates the __transaction_state topic
// (50 partitions) on a cluster that has none, and a cluster whose
// replication factor for it cannot be met answers it with an error. This
// type has the same fields and is registered as an override of the
// request's type (the mechanism kafka-go's rawproduce uses for Produce);
// not being a transactional message, it goes to any broker.
type initPIDRequest struct {
	// A tagged field marks the flexible versions, as in kafka-go's type.
	_                    struct{} `kafka:"min=v2,max=v4,tag"`
	TransactionalID      string   `kafka:"min=v0,max=v4,nullable"`
	TransactionTimeoutMs int32    `kafka:"min=v0,max=v4"`
	ProducerID           int64    `kafka:"min=v3,max=v4"`
	ProducerEpoch        int16    `kafka:"min=v3,max=v4"`
}

// initPIDOverride is initPIDRequest's key among kafka-go's overrides of
// request types (rawproduce's is 0).
const initPIDOverride protocol.OverrideTypeKey = 0x0b

func init() {
	protocol.RegisterOverride(&initPIDRequest{}, &initproducerid.Response{}, initPIDOverride)
}

func (r *initPIDRequest) ApiKey() protocol.ApiKey { return protocol.InitProducerId }

func (r *initPIDRequest) TypeKey() protocol.OverrideTypeKey { return initPIDOverride }

// checkVersions asks a bootstrap broker, once, which requests it
// supports: InitProducerId at all (Kafka 0.11; kafka-go would send it to
// an older broker anyway, which closes the connection), Produce v3 (record
// batches with producer fields), and InitProducerId v3 (Kafka 2.5: a
// producer may bump its epoch itself, KIP-360).
func (p *producer) checkVersions(ctx context.Context) error {
	p.mu.Lock()
	done := p.versions
	p.mu.Unlock()
	if done {
		return nil
	}
	res, err := p.client.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return fmt.Errorf("outbox: kafka: idempotent producer: ApiVersions: %w", err)
	}
	maxVersion := map[int]int{}
	for _, k := range res.ApiKeys {
		maxVersion[k.ApiKey] = k.MaxVersion
	}
	initPID, ok := maxVersion[apiInitProducerID]
	if !ok {
		return fmt.Errorf("%w: the broker has no InitProducerId request (Kafka before 0.11); set idempotent=false", ErrIdempotenceRefused)
	}
	if v, ok := maxVersion[apiProduce]; !ok || v < 3 {
		return fmt.Errorf("%w: the broker's Produce requests predate record batches (v%d, v3 needed); set idempotent=false", ErrIdempotenceRefused, v)
	}
	p.mu.Lock()
	p.versions, p.canBump = true, initPID >= 3
	p.mu.Unlock()
	return nil
}

// API keys of the Kafka protocol.
const (
	apiProduce        = 0
	apiInitProducerID = 22
)

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// produceIdempotent sends groups in one produce request of record
// batches carrying the lease's producer id and epoch and each partition's
// next sequence number, so the broker appends each batch at most once
// however often it receives it.
//
// A batch whose outcome is unknown (no answer, or an answer that does not
// say whether it was appended) is resent unchanged: see resend. A batch
// the broker refused for the producer's state (a sequence it did not
// expect, a producer it does not know, an epoch it fenced) was not
// appended; the producer moves on before its next request (Sink.failed
// sends the batch again then).
func (s *Sink) produceIdempotent(ctx context.Context, l *lease, msgs []sinks.Message, groups []*group, stamp func(*sinks.Message) time.Time) []error {
	batches := make([][]byte, len(groups))
	for j, g := range groups {
		batches[j] = appendBatch(nil, msgs, g.idx, stamp, l.fields(g.tp))
	}
	errs := s.exchange(ctx, rawRequest(s.cfg.WriteTimeout, groups, batches), groups)
	var unknown []int
	for j, err := range errs {
		if err != nil && outcomeUnknown(err) {
			unknown = append(unknown, j)
		}
	}
	if len(unknown) > 0 {
		tps := make([]topicPartition, len(unknown))
		for k, j := range unknown {
			tps[k] = groups[j].tp
		}
		l.doubt(tps)
		s.resend(ctx, groups, batches, errs, unknown)
	}
	for j, g := range groups {
		switch err := errs[j]; {
		case err == nil:
			l.appended(g.tp, len(g.idx))
		case outcomeUnknown(err):
			// The broker may hold the batch under this sequence, or not:
			// no other batch can follow it under this epoch.
			l.resetNext(resetBump)
		default:
			if kind := producerStateReset(err); kind != resetNone {
				s.log.WarnContext(ctx, "kafka: idempotent producer: the broker refused a record batch for the producer's state; moving on to a new epoch or producer id", "topic", g.tp.topic, "partition", g.tp.partition, "error", err)
				l.resetNext(kind)
			}
		}
	}
	return errs
}

// rawRequest is a produce request (acks=all) of pre-encoded record
// batches, batches[j] for groups[j].
func rawRequest(timeout time.Duration, groups []*group, batches [][]byte) *rawproduce.Request {
	req := &rawproduce.Request{Acks: int16(kafka.RequireAll), Timeout: int32(timeout / time.Millisecond)}
	topicIdx := map[string]int{}
	for j, g := range groups {
		ti, ok := topicIdx[g.tp.topic]
		if !ok {
			ti = len(req.Topics)
			topicIdx[g.tp.topic] = ti
			req.Topics = append(req.Topics, rawproduce.RequestTopic{Topic: g.tp.topic})
		}
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rawproduce.RequestPartition{
			Partition: g.tp.partition,
			RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(batches[j])},
		})
	}
	return req
}

// Resending a batch whose outcome is unknown: the first resend after
// resendFirstDelay, each later one after twice the previous delay, at most
// resendMaxDelay.
const (
	resendFirstDelay = 100 * time.Millisecond
	resendMaxDelay   = time.Second
)

// resend sends the batches of groups[pending...], whose outcome is
// unknown, again, byte for byte (the same producer id, epoch and
// sequence), each in a request of its own (its partition's leader may
// have changed), until the broker appends it or says it already had it.
// Only that ends the doubt: any other answer to a resend leaves the first
// attempt's outcome unknown. No resend starts later than twice
// metadata_ttl after the first attempt failed (kafka-go refreshes its
// metadata cache at least once in that time, so a partition whose leader
// failed over is sent to the new one), nor after ctx ends; errs[j] is
// then the first attempt's error, saying that the outcome is unknown.
func (s *Sink) resend(ctx context.Context, groups []*group, batches [][]byte, errs []error, pending []int) {
	start := time.Now()
	window := 2 * s.cfg.MetadataTTL
	delay := resendFirstDelay
	last := make([]error, len(groups))
	tries := 0
	for len(pending) > 0 {
		wait := min(delay, window-time.Since(start))
		if wait <= 0 || !sleep(ctx, wait) {
			break
		}
		delay = min(2*delay, resendMaxDelay)
		tries++
		var wg sync.WaitGroup
		for _, j := range pending {
			wg.Go(func() {
				last[j] = s.exchange(ctx, rawRequest(s.cfg.WriteTimeout, groups[j:j+1], batches[j:j+1]), groups[j:j+1])[0]
			})
		}
		wg.Wait()
		still := pending[:0]
		for _, j := range pending {
			if last[j] == nil {
				s.log.DebugContext(ctx, "kafka: record batch resent after an unknown outcome; the broker has it once", "topic", groups[j].tp.topic, "partition", groups[j].tp.partition, "resends", tries)
				errs[j] = nil
				continue
			}
			still = append(still, j)
		}
		pending = still
	}
	for _, j := range pending {
		g := groups[j]
		resent := "not resent"
		if last[j] != nil {
			resent = fmt.Sprintf("resent %d times with the same producer sequence over %s, last: %v", tries, time.Since(start).Round(time.Millisecond), last[j])
		}
		errs[j] = fmt.Errorf("%w (outcome unknown: the batch may have been appended; %s)", errs[j], resent)
		s.log.WarnContext(ctx, "kafka: idempotent producer: no answer to a record batch, resent unchanged; giving up: the relay's retry may append its records a second time", "topic", g.tp.topic, "partition", g.tp.partition, "resends", tries, "error", errs[j])
	}
}

// notAppendedCodes are the produce answers that say the broker refused
// the batch before appending it. Any other error leaves the outcome
// unknown: REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND come
// after the leader appended, and an unlisted code is not trusted either
// (resending a batch with its sequence is always safe).
var notAppendedCodes = map[kafka.Error]bool{
	kafka.InvalidMessage:              true, // CORRUPT_MESSAGE
	kafka.UnknownTopicOrPartition:     true,
	kafka.LeaderNotAvailable:          true,
	kafka.NotLeaderForPartition:       true,
	kafka.MessageSizeTooLarge:         true,
	kafka.InvalidTopic:                true,
	kafka.RecordListTooLarge:          true,
	kafka.NotEnoughReplicas:           true,
	kafka.InvalidRequiredAcks:         true,
	kafka.TopicAuthorizationFailed:    true,
	kafka.ClusterAuthorizationFailed:  true,
	kafka.InvalidTimestamp:            true,
	kafka.UnsupportedVersion:          true,
	kafka.UnsupportedForMessageFormat: true,
	kafka.OutOfOrderSequenceNumber:    true,
	kafka.InvalidProducerEpoch:        true,
	kafka.InvalidTransactionState:     true,
	kafka.InvalidProducerIDMapping:    true,
	kafka.UnknownProducerId:           true,
	kafka.FencedLeaderEpoch:           true,
	kafka.UnknownLeaderEpoch:          true,
	kafka.InvalidRecord:               true,
	kafka.ProducerFenced:              true,
}

// outcomeUnknown reports whether a produce error leaves open whether the
// broker appended the batch: the request may have gone out and no answer
// came back, or the answer does not say.
func outcomeUnknown(err error) bool {
	if sinks.IsNotSent(err) {
		return false
	}
	var routing *rawproduce.Error // the transport found no leader: not sent
	if errors.As(err, &routing) {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		return !notAppendedCodes[ke]
	}
	return true
}

// producerStateReset is how the producer must move on after err, a
// batch refused for the producer's state (not appended): a sequence the
// broker did not expect or a producer it does not know (it lost or
// expired the producer's state) restart the sequences under a new
// epoch; a fenced or unknown epoch takes a new producer id.
func producerStateReset(err error) resetKind {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return resetNone
	}
	switch ke {
	case kafka.OutOfOrderSequenceNumber, kafka.UnknownProducerId:
		return resetBump
	case kafka.InvalidProducerEpoch, kafka.ProducerFenced, kafka.InvalidProducerIDMapping, kafka.InvalidTransactionState:
		return resetNewID
	}
	return resetNone
}
