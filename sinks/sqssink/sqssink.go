// Package sqssink sends outbox messages to Amazon SQS queues.
//
// Each message becomes one SQS message: the payload is its body (as text,
// or base64), and message attributes carry the message id (outbox-id), its
// outbox position (outbox-seq), its key (outbox-key) and one String
// attribute per header, under the header's name. The queue URL is a
// template, so each topic may go to its own queue. On a FIFO queue (its
// name ends in .fifo) the key is the MessageGroupId, so SQS keeps each
// key's order for its consumers, and the message id is the
// MessageDeduplicationId, so SQS itself drops a redelivery within its
// five-minute deduplication window; a keyless message is its own group.
//
// A Send goes out as SendMessageBatch requests of at most 10 entries and
// max_message_bytes, several in flight at once. No request holds two
// messages of one key: a key's next message goes in a request sent after
// the one holding its previous message has been answered, so a failed
// entry (SQS answers per entry) stops its key before a later message of
// the key is sent. The sink is therefore KeySerial, like a publisher
// confirm round: the more keys a batch spans, the fuller its requests.
//
// Everything SQS would refuse for the message itself is checked before
// sending and dead-lettered with the reason: a body that is not text SQS
// takes (with body_encoding=text) or is empty, more attributes than SQS's
// 10, an attribute name SQS does not allow, an empty header value, a
// message above max_message_bytes. Nothing is dropped silently.
//
// The sink does not retry (the relay does, with its backoff kept in the
// row), and turns the SDK's retries off. A request that could not even
// connect (connection refused, an unresolvable endpoint) is reported as
// not attempted, so an unreachable endpoint costs the messages no
// attempts.
package sqssink

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/schemas"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrRefused is wrapped by the error of a message SQS refused; the
	// text has SQS's error code and message.
	ErrRefused = errors.New("outbox: sqs: refused")
	// ErrInvalid is wrapped by the (permanent) error of a message the sink
	// refused before sending, because SQS could never accept it.
	ErrInvalid = errors.New("outbox: sqs: message not accepted by SQS")
)

// Sink sends to SQS. It implements sinks.Sink, sinks.KeySerial and
// sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	queue    sinkconf.Template
	client   *sqs.Client
	log      *slog.Logger
	inflight sinks.Inflight
}

// New returns a sink for cfg. It validates cfg, applies the defaults and
// reads the SDK's configuration (environment, shared files); it does not
// connect. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	queue, err := sinkconf.ParseTemplate(cfg.QueueURL)
	if err != nil {
		return nil, fmt.Errorf("outbox: sqs: queue_url: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	client, err := newClient(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{cfg: cfg, queue: queue, client: client, log: logger.With("sink", "sqs")}, nil
}

// newClient builds the SQS client: the SDK's default chain for the region
// and credentials unless the config sets them, no SDK retries (the relay
// retries, with backoff kept in the row).
func newClient(ctx context.Context, cfg Config) (*sqs.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, awsconfig.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, string(cfg.SecretAccessKey), "")))
	}
	opts = append(opts, awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }))
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: sqs: loading the AWS SDK configuration: %w", err)
	}
	if ac.Region == "" {
		return nil, errors.New("outbox: sqs: region: not set, and none in the SDK's chain (AWS_REGION, the shared config file)")
	}
	return sqs.NewFromConfig(ac, func(o *sqs.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		if cfg.Protocol == "query" {
			o.Protocol = awsquery.New(schemas.AmazonSQS)
		}
	}), nil
}

// KeySerial reports true: a key's messages go one request after another.
func (s *Sink) KeySerial() bool { return true }

// Healthy asks SQS for the queue's ARN when the queue URL is not a
// template; with a template there is no one queue to ask about, and it
// reports nil.
func (s *Sink) Healthy(ctx context.Context) error {
	if strings.Contains(s.cfg.QueueURL, "{") {
		return nil
	}
	_, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(s.cfg.QueueURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		return fmt.Errorf("outbox: sqs: GetQueueAttributes: %w", err)
	}
	return nil
}

// Close refuses new Sends and waits for in-flight ones or ctx. It is
// idempotent.
func (s *Sink) Close(ctx context.Context) error {
	if err := s.inflight.Close(ctx); err != nil {
		return fmt.Errorf("outbox: sqs: close: in-flight sends still running: %w", err)
	}
	return nil
}

// entry is one message ready to send.
type entry struct {
	i     int // index in the batch
	queue string
	in    types.SendMessageBatchRequestEntry
	size  int
}

// Send sends msgs in rounds: each round holds at most one message of each
// key (the key's next one) and every keyless message left, grouped by
// queue into SendMessageBatch requests sent concurrently. See sinks.Sink
// for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	if !s.inflight.Enter() {
		return sinks.ErrClosed
	}
	defer s.inflight.Leave()
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: sqs: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()

	be := sinks.NewBatchError(len(msgs))
	var gate sinks.KeyGate
	entries := make([]*entry, len(msgs))
	left := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if gate.Blocked(m) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		e, err := s.entry(i, m)
		if err != nil {
			be.Errs[i] = sinks.Permanent(err)
			gate.Fail(m)
			continue
		}
		entries[i] = e
		left = append(left, i)
	}
	for len(left) > 0 {
		if err := ctx.Err(); err != nil {
			for _, i := range left {
				be.Errs[i] = fmt.Errorf("outbox: sqs: %w", err)
			}
			break
		}
		var round, rest []int
		taken := map[string]bool{}
		for _, i := range left {
			m := msgs[i]
			switch {
			case gate.Blocked(m):
				be.Errs[i] = sinks.ErrNotAttempted
			case m.Key != "" && taken[m.Key]:
				rest = append(rest, i)
			default:
				if m.Key != "" {
					taken[m.Key] = true
				}
				round = append(round, i)
			}
		}
		s.sendRound(ctx, round, entries, be)
		for _, i := range round {
			if be.Errs[i] != nil {
				gate.Fail(msgs[i])
			}
		}
		left = rest
	}
	return be.Err()
}

// sendRound sends the entries at idx (no two of one key) as requests of
// at most 10 entries and max_message_bytes per queue, Concurrency at a
// time, and records each entry's outcome in be.
func (s *Sink) sendRound(ctx context.Context, idx []int, entries []*entry, be *sinks.BatchError) {
	var reqs [][]*entry
	open := map[string]int{} // queue -> its request being filled
	bytes := map[string]int{}
	for _, i := range idx {
		e := entries[i]
		r, ok := open[e.queue]
		if !ok || len(reqs[r]) == MaxBatchEntries || bytes[e.queue]+e.size > s.cfg.MaxMessageBytes {
			reqs = append(reqs, nil)
			r = len(reqs) - 1
			open[e.queue] = r
			bytes[e.queue] = 0
		}
		reqs[r] = append(reqs[r], e)
		bytes[e.queue] += e.size
	}
	if len(reqs) == 1 {
		s.sendBatch(ctx, reqs[0], be)
		return
	}
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, req := range reqs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.sendBatch(ctx, req, be) // each request writes only its own entries' slots
		}()
	}
	wg.Wait()
}

// sendBatch sends one SendMessageBatch and records its entries' outcomes.
func (s *Sink) sendBatch(ctx context.Context, req []*entry, be *sinks.BatchError) {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(req[0].queue), Entries: make([]types.SendMessageBatchRequestEntry, len(req))}
	for j, e := range req {
		in.Entries[j] = e.in
	}
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		err = s.requestErr(req[0].queue, err)
		for _, e := range req {
			be.Errs[e.i] = err
		}
		return
	}
	done := make(map[string]bool, len(req))
	for _, ok := range out.Successful {
		done[aws.ToString(ok.Id)] = true
	}
	failed := make(map[string]types.BatchResultErrorEntry, len(out.Failed))
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = f
	}
	for _, e := range req {
		id := aws.ToString(e.in.Id)
		if f, ok := failed[id]; ok {
			be.Errs[e.i] = entryErr(e.queue, f)
		} else if !done[id] {
			be.Errs[e.i] = fmt.Errorf("%w: SendMessageBatch to %s answered nothing for entry %s", ErrRefused, e.queue, id)
		}
	}
}

// entry builds m's batch entry, or says why SQS could never take it.
func (s *Sink) entry(i int, m sinks.Message) (*entry, error) {
	queue := s.queue.Render(m.Topic, m.Key, m.Headers)
	if queue == "" {
		return nil, fmt.Errorf("%w: queue_url: the template renders an empty queue URL", ErrInvalid)
	}
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%w: the payload is empty (SQS refuses an empty message body)", ErrInvalid)
	}
	var body string
	if s.cfg.BodyEncoding == "base64" {
		body = base64.StdEncoding.EncodeToString(m.Payload)
	} else {
		if err := checkText(m.Payload); err != nil {
			return nil, fmt.Errorf("%w: the payload %v (set body_encoding=base64 for binary payloads)", ErrInvalid, err)
		}
		body = string(m.Payload)
	}
	n := 2 + len(m.Headers)
	if m.Key != "" {
		n++
	}
	if n > MaxAttributes {
		return nil, fmt.Errorf("%w: %d headers, and SQS takes %d message attributes of which the sink uses %d (outbox-id, outbox-seq, outbox-key)",
			ErrInvalid, len(m.Headers), MaxAttributes, n-len(m.Headers))
	}
	attrs := make(map[string]types.MessageAttributeValue, n)
	size := len(body)
	add := func(name, typ, v string) {
		attrs[name] = types.MessageAttributeValue{DataType: aws.String(typ), StringValue: aws.String(v)}
		size += len(name) + len(typ) + len(v)
	}
	add(AttrID, "String", m.ID)
	add(AttrSeq, "Number", strconv.FormatInt(m.Seq, 10))
	if m.Key != "" {
		if err := checkText([]byte(m.Key)); err != nil {
			return nil, fmt.Errorf("%w: the key %v", ErrInvalid, err)
		}
		add(AttrKey, "String", m.Key)
	}
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // the same error for the same message
	for _, k := range names {
		v := m.Headers[k]
		if err := checkAttrName(k); err != nil {
			return nil, fmt.Errorf("%w: header %q: %v", ErrInvalid, k, err)
		}
		if v == "" {
			return nil, fmt.Errorf("%w: header %q: the value is empty (SQS refuses an empty attribute value)", ErrInvalid, k)
		}
		if err := checkText([]byte(v)); err != nil {
			return nil, fmt.Errorf("%w: header %q: the value %v", ErrInvalid, k, err)
		}
		add(k, "String", v)
	}
	if size > s.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes with its attributes, above max_message_bytes (%d)", ErrInvalid, size, s.cfg.MaxMessageBytes)
	}
	e := &entry{i: i, queue: queue, size: size, in: types.SendMessageBatchRequestEntry{
		Id:                aws.String(strconv.Itoa(i)),
		MessageBody:       aws.String(body),
		MessageAttributes: attrs,
	}}
	if strings.HasSuffix(queue, ".fifo") {
		group := m.Key
		if group == "" {
			group = m.ID // keyless messages are not ordered: spread them
		}
		if len(group) > 128 {
			return nil, fmt.Errorf("%w: the key is %d bytes, and a FIFO MessageGroupId takes at most 128", ErrInvalid, len(group))
		}
		if err := checkGroupChars(group); err != nil {
			return nil, fmt.Errorf("%w: the key %v, as a FIFO MessageGroupId", ErrInvalid, err)
		}
		e.in.MessageGroupId = aws.String(group)
		e.in.MessageDeduplicationId = aws.String(m.ID)
	}
	return e, nil
}

// checkText reports a byte string SQS does not take as text: it must be
// UTF-8 of the characters #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD
// and #x10000 to #x10FFFF.
func checkText(b []byte) error {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("is not valid UTF-8 (byte %d)", i)
		}
		if !(r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF) {
			return fmt.Errorf("has character %U at byte %d, which SQS does not take", r, i)
		}
		i += n
	}
	return nil
}

// checkAttrName reports a name SQS refuses as a message attribute name:
// 1 to 256 of A-Z, a-z, 0-9, '_', '-', '.'; no leading, trailing or
// doubled '.'; not starting with "AWS." or "Amazon." (any case); not one
// of the sink's own attributes.
func checkAttrName(name string) error {
	switch {
	case name == AttrID || name == AttrSeq || name == AttrKey:
		return fmt.Errorf("is one of the sink's own attributes (%s, %s, %s)", AttrID, AttrSeq, AttrKey)
	case name == "" || len(name) > 256:
		return errors.New("an SQS attribute name has 1 to 256 characters")
	case name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, ".."):
		return errors.New("an SQS attribute name cannot start or end with '.' or hold '..'")
	}
	if l := strings.ToLower(name); strings.HasPrefix(l, "aws.") || strings.HasPrefix(l, "amazon.") {
		return errors.New(`an SQS attribute name cannot start with "AWS." or "Amazon."`)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("an SQS attribute name holds only A-Z, a-z, 0-9, '_', '-' and '.', not %q", r)
		}
	}
	return nil
}

// checkGroupChars reports a MessageGroupId character SQS refuses: it takes
// printable ASCII (! to ~).
func checkGroupChars(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return fmt.Errorf("has byte %#x at %d, and a MessageGroupId holds only printable ASCII", s[i], i)
		}
	}
	return nil
}
