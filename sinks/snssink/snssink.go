// Package snssink publishes outbox messages to Amazon SNS topics.
//
// Each message becomes one SNS message: the payload is its body (as text,
// or base64), and message attributes carry the message id (outbox-id),
// its outbox position (outbox-seq), its key (outbox-key) and one String
// attribute per header, under the header's name (the layout of the SQS
// sink, so that an SQS queue subscribed with raw message delivery gets
// what the SQS sink would send). The topic ARN is a template, so each
// outbox topic may go to its own SNS topic. On a FIFO topic (its name ends
// in .fifo) the key is the MessageGroupId, so SNS and its FIFO queue
// subscriptions keep each key's order, and the message id is the
// MessageDeduplicationId, so SNS drops a redelivery within its
// five-minute deduplication window; a keyless message is its own group.
//
// A Send goes out as PublishBatch requests of at most 10 entries and
// max_message_bytes, several in flight at once, in rounds that never put
// two messages of one key in a request (see package awsbatch): a failed
// entry stops its key before a later message of the key is published.
//
// What SNS would refuse for the message itself is checked before sending
// and dead-lettered with the reason, as in the SQS sink; a request that
// could not connect is reported as not attempted. The sink does not retry,
// and turns the SDK's retries off.
package snssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrRefused is wrapped by the error of a message SNS refused; the
	// text has SNS's error code and message.
	ErrRefused = errors.New("outbox: sns: refused")
	// ErrInvalid is wrapped by the (permanent) error of a message the sink
	// refused before sending, because SNS could never accept it.
	ErrInvalid = errors.New("outbox: sns: message not accepted by SNS")
)

// Sink publishes to SNS. It implements sinks.Sink, sinks.KeySerial and
// sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	topic    sinkconf.Template
	layout   awsbatch.Layout
	client   *sns.Client
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
	topic, log, err := awsbatch.Start("sns", "topic_arn", cfg.TopicARN, logger)
	if err != nil {
		return nil, err
	}
	client, err := newClient(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	layout := awsbatch.Layout{Service: "SNS", Invalid: ErrInvalid, Base64: cfg.BodyEncoding == "base64", MaxBytes: cfg.MaxMessageBytes}
	return &Sink{cfg: cfg, topic: topic, layout: layout, client: client, log: log}, nil
}

// newClient builds the SNS client: the SDK's default chain for the region
// and credentials unless the config sets them, no SDK retries (the relay
// retries, with backoff kept in the row).
func newClient(ctx context.Context, cfg Config) (*sns.Client, error) {
	ac, err := cfg.fields().Options().AWSConfig(ctx, "sns")
	if err != nil {
		return nil, err
	}
	return sns.NewFromConfig(ac, func(o *sns.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	}), nil
}

// KeySerial reports true: a key's messages go one request after another.
func (s *Sink) KeySerial() bool { return true }

// Healthy asks SNS for the topic's attributes when the topic ARN is not a
// template; with a template there is no one topic to ask about, and it
// reports nil.
func (s *Sink) Healthy(ctx context.Context) error {
	if strings.Contains(s.cfg.TopicARN, "{") {
		return nil
	}
	if _, err := s.client.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: aws.String(s.cfg.TopicARN)}); err != nil {
		return fmt.Errorf("outbox: sns: GetTopicAttributes: %w", err)
	}
	return nil
}

// Close refuses new Sends and waits for in-flight ones or ctx. It is
// idempotent.
func (s *Sink) Close(ctx context.Context) error { return s.inflight.Shut(ctx, "outbox: sns") }

// Send publishes msgs in rounds (see package awsbatch). See sinks.Sink
// for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: sns", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	return awsbatch.Plan{
		Build:       s.entry,
		Send:        s.publishBatch,
		MaxBytes:    s.cfg.MaxMessageBytes,
		Concurrency: s.cfg.Concurrency,
	}.Run(ctx, msgs, "outbox: sns")
}

// entry builds m's batch entry, or says why SNS could never take it.
func (s *Sink) entry(i int, m sinks.Message) (*awsbatch.Entry, error) {
	return s.layout.Build(i, m, s.topic.Render(m.Topic, m.Key, m.Headers))
}

// publishBatch sends one PublishBatch and returns its entries' outcomes.
func (s *Sink) publishBatch(ctx context.Context, req []*awsbatch.Entry) []error {
	in := &sns.PublishBatchInput{TopicArn: aws.String(req[0].Dest), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(req))}
	for j, e := range req {
		in.PublishBatchRequestEntries[j] = toEntry(e)
	}
	out, err := s.client.PublishBatch(ctx, in)
	if err != nil {
		return service.Outcomes(req, err, nil, nil)
	}
	return awsbatch.Answer(service, req, out.Successful, func(e types.PublishBatchResultEntry) *string { return e.Id }, out.Failed, failure)
}

// attr is one message attribute.
func attr(typ, v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String(typ), StringValue: aws.String(v)}
}

// toEntry is e as an SNS batch entry.
func toEntry(e *awsbatch.Entry) types.PublishBatchRequestEntry {
	in := types.PublishBatchRequestEntry{Id: aws.String(e.ID()), Message: aws.String(e.Body), MessageAttributes: awsbatch.Attrs(e, attr)}
	if e.Group != "" {
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(e.Group), aws.String(e.Dedup)
	}
	return in
}

// permanentCodes are the SNS error codes that say a message, or its
// topic, can never be accepted: the message is dead-lettered at once.
// Every other code is retried (throttling, internal errors, KMS and
// credential trouble an operator can fix), bounded by max attempts.
var permanentCodes = []string{
	"InvalidParameter", "InvalidParameterValue", "ParameterValueInvalid", "ValidationException",
	"NotFound", "AWS.SimpleNotificationService.NonExistentTopic",
	"BatchRequestTooLong", "TooManyEntriesInBatchRequest", "BatchEntryIdsNotDistinct",
	"InvalidBatchEntryId", "EmptyBatchRequest",
}

func permanentCode(code string) bool { return slices.Contains(permanentCodes, code) }

// service reads SNS's answers.
var service = awsbatch.Service{Prefix: "outbox: sns", Op: "PublishBatch", Refused: ErrRefused, Permanent: permanentCode}

// failure reads SNS's refusal of a batch entry.
func failure(f types.BatchResultErrorEntry) (id, code, msg *string) { return f.Id, f.Code, f.Message }

// entryErr classifies SNS's refusal of one batch entry.
func entryErr(topic string, f types.BatchResultErrorEntry) error {
	return service.Refusal(topic, aws.ToString(f.Code), aws.ToString(f.Message))
}
