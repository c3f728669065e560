package kinesissink

import (
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultStream       = "{topic}"
	DefaultRecordFormat = FormatRaw
	DefaultConcurrency  = 8
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout = sinks.DefaultSendTimeout
)

// Record formats: what a record's data holds.
const (
	// FormatRaw: the data is the payload, byte for byte. A Kinesis record
	// has no attributes, so the message id, position and headers do not
	// travel; a message with headers is refused (dead-lettered with the
	// reason) unless DropHeaders is set. The relay's own outbox-producer
	// header (sinks.HeaderProducer) goes with the id and the position,
	// refusing nothing.
	FormatRaw = "raw"
	// FormatJSON: the data is a JSON envelope holding the message id,
	// position, topic, key, headers, creation time and the payload in
	// base64 (see Envelope).
	FormatJSON = "json"
)

// Kinesis' limits, checked before sending.
const (
	// MaxRecordBytes is the largest record: data plus partition key.
	MaxRecordBytes = 1 << 20
	// MaxRequestBytes is the largest PutRecords request: every record's
	// data plus partition key.
	MaxRequestBytes = 5 << 20
	// MaxRecords is the most records of one PutRecords request.
	MaxRecords = 500
	// MaxPartitionKey is the most Unicode characters of a partition key.
	MaxPartitionKey = 256
	// MaxStreamName is the most characters of a stream name.
	MaxStreamName = 128
)

// Config configures the Amazon Kinesis Data Streams sink. Zero values
// select the defaults documented on each field. Every field can also be
// set as a query parameter of the --sink URL under its yaml name:
// kinesis://?stream={topic}&region=eu-west-1
type Config struct {
	// Stream is a template for each message's stream: literal text plus
	// {topic}, {key} and {header:NAME}. It renders a stream name, or a
	// stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME). A fixed
	// name sends every message to one stream. Default: "{topic}".
	Stream string `yaml:"stream"`
	// RecordFormat is what a record's data holds: "raw" (the payload,
	// byte for byte; the message id, position and headers do not travel)
	// or "json" (an envelope with the id, position, topic, key, headers,
	// creation time and the payload in base64). Default: "raw".
	RecordFormat string `yaml:"record_format"`
	// DropHeaders, with record_format=raw, sends a message that has
	// headers without them. When false (the default), such a message is
	// dead-lettered with the reason, so that no header is lost silently.
	// It is an error with record_format=json, which carries headers.
	DropHeaders bool `yaml:"drop_headers"`
	// Region is the AWS region. Default: the SDK's chain (AWS_REGION,
	// AWS_DEFAULT_REGION, the shared config file's profile).
	Region string `yaml:"region"`
	// Endpoint overrides the service endpoint, for a local server
	// (http://127.0.0.1:4567). Default: the region's Kinesis endpoint.
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID and SecretAccessKey are static credentials, set
	// together. Default: the SDK's credential chain (environment, shared
	// files, web identity, ECS and EC2 roles).
	AccessKeyID     string          `yaml:"access_key_id"`
	SecretAccessKey sinkconf.Secret `yaml:"secret_access_key"`
	// Concurrency is the number of PutRecords requests one Send has in
	// flight. Default: 8.
	Concurrency int `yaml:"concurrency"`
	// PublishTimeout bounds one Send. When 0 (unset), a Send is bounded by
	// the caller's deadline alone (the relay's --publish-timeout), or by
	// DefaultPublishTimeout when the caller set none; when set, it bounds
	// each Send inside the caller's deadline, whichever ends first (see
	// sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.RecordFormat == "" {
		c.RecordFormat = DefaultRecordFormat
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// Validate reports the first problem in c, naming the field. Errors never
// contain the secret key.
func (c Config) Validate() error {
	if c.Stream != "" {
		if _, err := sinkconf.ParseTemplate(c.Stream); err != nil {
			return fmt.Errorf("outbox: kinesis: stream: %w", err)
		}
	}
	switch c.RecordFormat {
	case "", FormatRaw:
	case FormatJSON:
		if c.DropHeaders {
			return errors.New("outbox: kinesis: drop_headers: only with record_format=raw (the json envelope carries headers)")
		}
	default:
		return fmt.Errorf(`outbox: kinesis: record_format: want "raw" or "json", got %q`, c.RecordFormat)
	}
	return c.options().Validate("kinesis", MaxRecordBytes)
}

// ParseURL parses a --sink URL such as kinesis://?stream={topic}&region=eu-west-1
// into a validated Config (see sinkconf.ParseConfig for its parameters).
// The URL has no host or path: the stream is a parameter, since it is a
// template.
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, checkBase)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, checkBase)
}

func checkBase(_ *Config, base string) error {
	return awsbatch.CheckBase("kinesis", base, "stream", "the stream")
}

var params = sinkconf.NewParams("kinesis", "",
	sinkconf.Routing(sinkconf.String("stream", func(c *Config) *string { return &c.Stream })),
	sinkconf.Routing(sinkconf.String("record_format", func(c *Config) *string { return &c.RecordFormat })),
	sinkconf.Routing(sinkconf.Bool("drop_headers", func(c *Config) *bool { return &c.DropHeaders })),
	sinkconf.Routing(sinkconf.String("region", func(c *Config) *string { return &c.Region })),
	sinkconf.Routing(sinkconf.String("endpoint", func(c *Config) *string { return &c.Endpoint })),
	sinkconf.String("access_key_id", func(c *Config) *string { return &c.AccessKeyID }),
	sinkconf.Func("secret_access_key",
		func(c *Config, v string) error { c.SecretAccessKey = sinkconf.Secret(v); return nil },
		func(c *Config) string { return c.SecretAccessKey.String() }),
	sinkconf.Int("concurrency", func(c *Config) *int { return &c.Concurrency }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
)

// options are the options the AWS sinks share (package awsbatch): the
// region, endpoint and credentials, the concurrency and the timeout.
func (c Config) options() awsbatch.Options {
	return awsbatch.Options{Region: c.Region, Endpoint: c.Endpoint, AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey,
		Concurrency: c.Concurrency, PublishTimeout: c.PublishTimeout}
}

// Redacted returns the configuration as a --sink URL with the secret key
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	return redact.URL("kinesis://?" + params.Query(&c).Encode())
}

// Target is the identity of c's destination (see sinks.Targeter): the stream, the region and endpoint, and the record format,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, "kinesis://")
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }
