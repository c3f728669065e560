// Package kinesissink sends outbox messages to Amazon Kinesis Data
// Streams.
//
// Each message becomes one record. Its partition key is the message key,
// so a key's records land on one shard, in order; a keyless message uses
// its id, which spreads keyless messages over the shards. Its data is, by
// record_format, either the payload byte for byte ("raw") or a JSON
// envelope (Envelope: id, position, topic, key, headers, creation time,
// and the payload in base64). A Kinesis record has no attributes: in raw
// format the message id, position and headers do not travel, and a
// message with headers is dead-lettered with the reason unless
// drop_headers is set. The stream is a template, so each topic may go to
// its own stream.
//
// A Send goes out as PutRecords requests of at most 500 records and
// 5 MiB, several in flight at once. Kinesis answers per record and goes
// on after a failed record, so two records of one key in one request
// could land out of order (the later one stored, the earlier refused).
// No request therefore holds two messages of one key: a key's next
// message goes in a request sent after the one holding its previous
// message has been answered, and a failed record stops its key (its later
// messages are reported sinks.ErrNotAttempted) before a later message of
// the key is sent. The sink is therefore KeySerial: the more keys a batch
// spans, the fuller its requests.
//
// What Kinesis would refuse for the record itself is checked before
// sending and dead-lettered with the reason: a record above 1 MiB with
// its partition key, a key longer than 256 characters or not UTF-8, a
// stream name Kinesis does not allow, and (raw format) headers. Nothing
// is dropped silently.
//
// The sink does not retry (the relay does, with its backoff kept in the
// row), and turns the SDK's retries off. A request that could not even
// connect (connection refused, an unresolvable endpoint) is reported as
// not attempted, so an unreachable endpoint costs the messages no
// attempts.
package kinesissink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrRefused is wrapped by the error of a message Kinesis refused; the
	// text has Kinesis' error code and message.
	ErrRefused = errors.New("outbox: kinesis: refused")
	// ErrInvalid is wrapped by the (permanent) error of a message the sink
	// refused before sending, because Kinesis could never accept it.
	ErrInvalid = errors.New("outbox: kinesis: message not accepted by Kinesis")
)

// Envelope is a record's data with record_format=json. Key and Headers
// are left out when the message has none. Payload is standard base64 in
// the JSON, so that any payload travels byte for byte.
type Envelope struct {
	ID        string            `json:"id"`
	Seq       int64             `json:"seq"`
	Topic     string            `json:"topic"`
	Key       string            `json:"key,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	CreatedAt time.Time         `json:"created_at,omitzero"`
	Payload   []byte            `json:"payload"`
}

// Sink sends to Kinesis. It implements sinks.Sink, sinks.KeySerial and
// sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	stream   sinkconf.Template
	client   *kinesis.Client
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
	stream, log, err := awsbatch.Start("kinesis", "stream", cfg.Stream, logger)
	if err != nil {
		return nil, err
	}
	client, err := newClient(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{cfg: cfg, stream: stream, client: client, log: log}, nil
}

// newClient builds the Kinesis client: the SDK's default chain for the
// region and credentials unless the config sets them, no SDK retries (the
// relay retries, with backoff kept in the row).
func newClient(ctx context.Context, cfg Config) (*kinesis.Client, error) {
	ac, err := cfg.options().AWSConfig(ctx, "kinesis")
	if err != nil {
		return nil, err
	}
	return kinesis.NewFromConfig(ac, func(o *kinesis.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	}), nil
}

// KeySerial reports true: a key's messages go one request after another.
func (s *Sink) KeySerial() bool { return true }

// Healthy asks Kinesis about the stream when the stream is not a
// template; with a template there is no one stream to ask about, and it
// lists one stream instead (which checks the endpoint and credentials).
func (s *Sink) Healthy(ctx context.Context) error {
	if !strings.Contains(s.cfg.Stream, "{") {
		in := &kinesis.DescribeStreamSummaryInput{}
		setStream(&in.StreamName, &in.StreamARN, s.cfg.Stream)
		if _, err := s.client.DescribeStreamSummary(ctx, in); err != nil {
			return fmt.Errorf("outbox: kinesis: DescribeStreamSummary: %w", err)
		}
		return nil
	}
	if _, err := s.client.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)}); err != nil {
		return fmt.Errorf("outbox: kinesis: ListStreams: %w", err)
	}
	return nil
}

// Close refuses new Sends and waits for in-flight ones or ctx. It is
// idempotent.
func (s *Sink) Close(ctx context.Context) error { return s.inflight.Shut(ctx, "outbox: kinesis") }

// Send sends msgs in rounds (see package awsbatch): each round holds at
// most one message of each key (the key's next one) and every keyless
// message left, grouped by stream into PutRecords requests sent
// concurrently. See sinks.Sink for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: kinesis", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	return s.plan().Run(ctx, msgs, "outbox: kinesis")
}

// plan is how a Send goes out: records built by entry, PutRecords
// requests of at most MaxRecords and MaxRequestBytes.
func (s *Sink) plan() awsbatch.Plan {
	return awsbatch.Plan{
		Build:       s.entry,
		Send:        s.putRecords,
		MaxBytes:    MaxRequestBytes,
		MaxEntries:  MaxRecords,
		Concurrency: s.cfg.Concurrency,
	}
}

// entry builds m's record, or says why Kinesis could never take it.
func (s *Sink) entry(i int, m sinks.Message) (*awsbatch.Entry, error) {
	stream := s.stream.Render(m.Topic, m.Key, m.Headers)
	if err := checkStream(stream); err != nil {
		return nil, fmt.Errorf("%w: the stream %q rendered from %q %v", ErrInvalid, stream, s.cfg.Stream, err)
	}
	pk := m.Key
	if pk == "" {
		pk = m.ID // keyless messages are not ordered: spread them
	}
	if !utf8.ValidString(pk) {
		return nil, fmt.Errorf("%w: the key is not valid UTF-8, and a partition key is a Unicode string", ErrInvalid)
	}
	if n := utf8.RuneCountInString(pk); n > MaxPartitionKey || n == 0 {
		return nil, fmt.Errorf("%w: the partition key has %d characters, and Kinesis takes 1 to %d", ErrInvalid, n, MaxPartitionKey)
	}
	data, err := s.data(m)
	if err != nil {
		return nil, err
	}
	size := len(data) + len(pk)
	if size > MaxRecordBytes {
		return nil, fmt.Errorf("%w: the record is %d bytes with its partition key, above Kinesis' limit of %d (1 MiB)", ErrInvalid, size, MaxRecordBytes)
	}
	return &awsbatch.Entry{I: i, Dest: stream, Body: string(data), PartitionKey: pk, Size: size}, nil
}

// data is m's record data by record_format.
func (s *Sink) data(m sinks.Message) ([]byte, error) {
	if s.cfg.RecordFormat == FormatJSON {
		p := m.Payload
		if p == nil {
			p = []byte{} // "" rather than null
		}
		b, err := json.Marshal(Envelope{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Key: m.Key, Headers: m.Headers, CreatedAt: m.CreatedAt, Payload: p})
		if err != nil {
			return nil, fmt.Errorf("%w: encoding the JSON envelope: %v", ErrInvalid, err)
		}
		return b, nil
	}
	if n := appHeaders(m.Headers); n > 0 && !s.cfg.DropHeaders {
		return nil, fmt.Errorf("%w: the message has %d headers, and a raw Kinesis record carries none "+
			"(set record_format=json to carry them in an envelope, or drop_headers=true to send the payload without them)", ErrInvalid, n)
	}
	return m.Payload, nil
}

// appHeaders counts the headers of h that a raw record would lose and
// that refuse the message: the relay's outbox-producer is not one of
// them, since a raw record carries none of the relay's metadata (the id
// and the position go too), and refusing it would dead-letter every
// message of a raw stream.
func appHeaders(h map[string]string) int {
	if _, ok := h[sinks.HeaderProducer]; ok {
		return len(h) - 1
	}
	return len(h)
}

// checkStream reports a stream Kinesis does not take: an ARN of a
// Kinesis stream, or a name of 1 to 128 of a-z, A-Z, 0-9, '_', '.', '-'.
func checkStream(s string) error {
	if strings.HasPrefix(s, "arn:") {
		if !strings.Contains(s, ":kinesis:") || !strings.Contains(s, ":stream/") {
			return errors.New("is not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
		}
		return nil
	}
	if s == "" || len(s) > MaxStreamName {
		return fmt.Errorf("is not a stream name: a name has 1 to %d characters", MaxStreamName)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("is not a stream name: a name holds only a-z, A-Z, 0-9, '_', '.' and '-', not %q", r)
		}
	}
	return nil
}

// setStream sets the name or the ARN of a request's stream.
func setStream(name, arn **string, stream string) {
	if strings.HasPrefix(stream, "arn:") {
		*arn = aws.String(stream)
	} else {
		*name = aws.String(stream)
	}
}

// putRecords sends one PutRecords request (records of one stream, no two
// of one key) and returns each record's outcome, in order.
func (s *Sink) putRecords(ctx context.Context, req []*awsbatch.Entry) []error {
	stream := req[0].Dest
	in := &kinesis.PutRecordsInput{Records: make([]types.PutRecordsRequestEntry, len(req))}
	setStream(&in.StreamName, &in.StreamARN, stream)
	for j, e := range req {
		in.Records[j] = types.PutRecordsRequestEntry{Data: []byte(e.Body), PartitionKey: aws.String(e.PartitionKey)}
	}
	out, err := s.client.PutRecords(ctx, in)
	errs := make([]error, len(req))
	if err != nil {
		err = requestErr(stream, err)
		for j := range errs {
			errs[j] = err
		}
		return errs
	}
	return answer(stream, out.Records, len(req))
}

// answer reads PutRecords' per-record results, which are in request
// order: a record with an error code was refused; a record the answer
// does not cover (it should not happen) failed as refused.
func answer(stream string, res []types.PutRecordsResultEntry, n int) []error {
	errs := make([]error, n)
	for j := range errs {
		switch {
		case j >= len(res):
			errs[j] = fmt.Errorf("%w: PutRecords to %s answered %d results for %d records", ErrRefused, stream, len(res), n)
		case res[j].ErrorCode != nil:
			errs[j] = refusal(stream, aws.ToString(res[j].ErrorCode), aws.ToString(res[j].ErrorMessage))
		case res[j].SequenceNumber == nil:
			errs[j] = fmt.Errorf("%w: PutRecords to %s answered neither a sequence number nor an error for record %d", ErrRefused, stream, j)
		}
	}
	return errs
}
