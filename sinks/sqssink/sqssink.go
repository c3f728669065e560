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
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/schemas"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
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
	layout   awsbatch.Layout
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
	queue, log, err := awsbatch.Start("sqs", "queue_url", cfg.QueueURL, logger)
	if err != nil {
		return nil, err
	}
	client, err := newClient(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	layout := awsbatch.Layout{Service: "SQS", Invalid: ErrInvalid, Base64: cfg.BodyEncoding == "base64", MaxBytes: cfg.MaxMessageBytes}
	return &Sink{cfg: cfg, queue: queue, layout: layout, client: client, log: log}, nil
}

// newClient builds the SQS client: the SDK's default chain for the region
// and credentials unless the config sets them, no SDK retries (the relay
// retries, with backoff kept in the row).
func newClient(ctx context.Context, cfg Config) (*sqs.Client, error) {
	ac, err := cfg.fields().Options().AWSConfig(ctx, "sqs")
	if err != nil {
		return nil, err
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
func (s *Sink) Close(ctx context.Context) error { return s.inflight.Shut(ctx, "outbox: sqs") }

// Send sends msgs in rounds (see package awsbatch): each round holds at
// most one message of each key (the key's next one) and every keyless
// message left, grouped by queue into SendMessageBatch requests sent
// concurrently. See sinks.Sink for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: sqs", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	return awsbatch.Plan{
		Build:       s.entry,
		Send:        s.sendBatch,
		MaxBytes:    s.cfg.MaxMessageBytes,
		Concurrency: s.cfg.Concurrency,
	}.Run(ctx, msgs, "outbox: sqs")
}

// entry builds m's batch entry, or says why SQS could never take it.
func (s *Sink) entry(i int, m sinks.Message) (*awsbatch.Entry, error) {
	return s.layout.Build(i, m, s.queue.Render(m.Topic, m.Key, m.Headers))
}

// sendBatch sends one SendMessageBatch and returns its entries' outcomes.
func (s *Sink) sendBatch(ctx context.Context, req []*awsbatch.Entry) []error {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(req[0].Dest), Entries: make([]types.SendMessageBatchRequestEntry, len(req))}
	for j, e := range req {
		in.Entries[j] = toEntry(e)
	}
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		return service.Outcomes(req, err, nil, nil)
	}
	return awsbatch.Answer(service, req, out.Successful, func(e types.SendMessageBatchResultEntry) *string { return e.Id }, out.Failed, failure)
}

// attr is one message attribute.
func attr(typ, v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String(typ), StringValue: aws.String(v)}
}

// toEntry is e as an SQS batch entry.
func toEntry(e *awsbatch.Entry) types.SendMessageBatchRequestEntry {
	in := types.SendMessageBatchRequestEntry{Id: aws.String(e.ID()), MessageBody: aws.String(e.Body), MessageAttributes: awsbatch.Attrs(e, attr)}
	if e.Group != "" {
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(e.Group), aws.String(e.Dedup)
	}
	return in
}
