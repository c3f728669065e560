package sqssink

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
	DefaultProtocol        = "json"
	DefaultBodyEncoding    = "text"
	DefaultMaxMessageBytes = 256 << 10
	DefaultConcurrency     = 8
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout = sinks.DefaultSendTimeout
)

// LargestMessageBytes is the largest max_message_bytes: the service's own
// ceiling for a message and for a batch.
const LargestMessageBytes = 1 << 20

// Message attributes the sink sets on every message, besides one per
// header.
const (
	AttrID  = awsbatch.AttrID  // the message id (String)
	AttrSeq = awsbatch.AttrSeq // the message's position in the outbox (Number); per key, it only grows
	AttrKey = awsbatch.AttrKey // the outbox key (String), absent when the message has none
)

// Config configures the Amazon SQS sink. Zero values select the defaults
// documented on each field. Every field can also be set as a query
// parameter of the --sink URL under its yaml name:
// sqs://?queue_url=https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}&region=eu-west-1
type Config struct {
	// QueueURL is a template for each message's queue URL: literal text
	// plus {topic}, {key} and {header:NAME}. A queue whose name ends in
	// .fifo is a FIFO queue: the message key becomes MessageGroupId and
	// the message id MessageDeduplicationId. Required.
	QueueURL string `yaml:"queue_url"`
	// Region is the AWS region. Default: the SDK's chain (AWS_REGION,
	// AWS_DEFAULT_REGION, the shared config file's profile).
	Region string `yaml:"region"`
	// Endpoint overrides the service endpoint, for a local server
	// (http://127.0.0.1:4100). Default: the region's SQS endpoint.
	Endpoint string `yaml:"endpoint"`
	// Protocol is the wire protocol: "json" (AWS JSON 1.0, what SQS and
	// the SDK use today) or "query" (the older form-encoded protocol,
	// which SQS still takes, for local servers that know only it, such as
	// goaws). Default: "json".
	Protocol string `yaml:"protocol"`
	// AccessKeyID and SecretAccessKey are static credentials, set
	// together. Default: the SDK's credential chain (environment, shared
	// files, web identity, ECS and EC2 roles).
	AccessKeyID     string          `yaml:"access_key_id"`
	SecretAccessKey sinkconf.Secret `yaml:"secret_access_key"`
	// BodyEncoding is how the payload becomes the message body: "text"
	// (the payload as it is; SQS takes only text, so a payload that is not
	// valid UTF-8 of the characters SQS allows, or is empty, is
	// dead-lettered with the reason) or "base64" (standard base64, for
	// binary payloads; the consumer decodes every body). SQS refuses an
	// empty body in either encoding: an empty payload is dead-lettered.
	// Default: "text".
	BodyEncoding string `yaml:"body_encoding"`
	// MaxMessageBytes is the largest message the sink sends: body plus
	// every attribute's name, type and value, as SQS counts it, and also
	// the most bytes of one batch. A larger message is dead-lettered
	// before it is sent. Set it to the queue's MaximumMessageSize when
	// that is larger (at most 1 MiB). Default: 256 KiB.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Concurrency is the number of SendMessageBatch requests one Send has
	// in flight. Default: 8.
	Concurrency int `yaml:"concurrency"`
	// PublishTimeout bounds one Send inside the caller's
	// deadline (the relay's --publish-timeout); 0 leaves the bound to the
	// caller (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
}

func (c Config) withDefaults() Config {
	if c.Protocol == "" {
		c.Protocol = DefaultProtocol
	}
	if c.BodyEncoding == "" {
		c.BodyEncoding = DefaultBodyEncoding
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// Validate reports the first problem in c, naming the field. Errors never
// contain the secret key.
func (c Config) Validate() error {
	if c.QueueURL == "" {
		return errors.New("outbox: sqs: queue_url: required (https://sqs.REGION.amazonaws.com/ACCOUNT/{topic})")
	}
	if _, err := sinkconf.ParseTemplate(c.QueueURL); err != nil {
		return fmt.Errorf("outbox: sqs: queue_url: %w", err)
	}
	switch c.Protocol {
	case "", "json", "query":
	default:
		return fmt.Errorf(`outbox: sqs: protocol: want "json" or "query", got %q`, c.Protocol)
	}
	return c.fields().Options().Validate("sqs", LargestMessageBytes)
}

// ParseURL parses a --sink URL such as
// sqs://?queue_url=https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}
// into a validated Config (see sinkconf.ParseConfig for its parameters).
// The URL has no host or path: the queue URL is a parameter, since it is
// a template.
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, checkBase)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, checkBase)
}

func checkBase(_ *Config, base string) error {
	return awsbatch.CheckBase("sqs", base, "queue_url", "the queue URL")
}

var params = sinkconf.NewParams("sqs", "",
	sinkconf.Routing(sinkconf.String("queue_url", func(c *Config) *string { return &c.QueueURL })),
	sinkconf.String("protocol", func(c *Config) *string { return &c.Protocol }),
).With(awsbatch.Params((*Config).fields)...)

// fields points at the options the SQS and SNS sinks share.
func (c *Config) fields() awsbatch.Fields {
	return awsbatch.Fields{Region: &c.Region, Endpoint: &c.Endpoint, AccessKeyID: &c.AccessKeyID, SecretAccessKey: &c.SecretAccessKey,
		BodyEncoding: &c.BodyEncoding, MaxMessageBytes: &c.MaxMessageBytes, Concurrency: &c.Concurrency, PublishTimeout: &c.PublishTimeout}
}

// Redacted returns the configuration as a --sink URL with the secret key
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	return redact.URL("sqs://?" + params.Query(&c).Encode())
}

// Target is the identity of c's destination (see sinks.Targeter): the queue URL, the region and endpoint, and the body
// encoding,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, "sqs://")
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }
