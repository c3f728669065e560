package snssink

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
	DefaultBodyEncoding    = "text"
	DefaultMaxMessageBytes = 256 << 10
	DefaultConcurrency     = 8
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout = sinks.DefaultSendTimeout
)

// LargestMessageBytes is the largest max_message_bytes: SNS's own ceiling
// for a message and for a PublishBatch.
const LargestMessageBytes = 256 << 10

// Message attributes the sink sets on every message, besides one per
// header.
const (
	AttrID  = awsbatch.AttrID  // the message id (String)
	AttrSeq = awsbatch.AttrSeq // the message's position in the outbox (Number); per key, it only grows
	AttrKey = awsbatch.AttrKey // the outbox key (String), absent when the message has none
)

// Config configures the Amazon SNS sink. Zero values select the defaults
// documented on each field. Every field can also be set as a query
// parameter of the --sink URL under its yaml name:
// sns://?topic_arn=arn:aws:sns:eu-west-1:123456789012:{topic}
type Config struct {
	// TopicARN is a template for each message's topic ARN: literal text
	// plus {topic}, {key} and {header:NAME}. A topic whose name ends in
	// .fifo is a FIFO topic: the message key becomes MessageGroupId and
	// the message id MessageDeduplicationId. Required.
	TopicARN string `yaml:"topic_arn"`
	// Region is the AWS region. Default: the SDK's chain (AWS_REGION,
	// AWS_DEFAULT_REGION, the shared config file's profile).
	Region string `yaml:"region"`
	// Endpoint overrides the service endpoint, for a local server
	// (http://127.0.0.1:4100). Default: the region's SNS endpoint.
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID and SecretAccessKey are static credentials, set
	// together. Default: the SDK's credential chain (environment, shared
	// files, web identity, ECS and EC2 roles).
	AccessKeyID     string          `yaml:"access_key_id"`
	SecretAccessKey sinkconf.Secret `yaml:"secret_access_key"`
	// BodyEncoding is how the payload becomes the message: "text" (the
	// payload as it is; a payload that is not valid UTF-8 of the
	// characters SNS allows is dead-lettered with the reason) or "base64"
	// (standard base64, for binary payloads; the consumer decodes every
	// message). SNS refuses an empty message in either encoding: an empty
	// payload is dead-lettered. Default: "text".
	BodyEncoding string `yaml:"body_encoding"`
	// MaxMessageBytes is the largest message the sink sends: body plus
	// every attribute's name, type and value, and also the most bytes of
	// one PublishBatch. A larger message is dead-lettered before it is
	// sent. At most 256 KiB (SNS's limit). Default: 256 KiB.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Concurrency is the number of PublishBatch requests one Send has in
	// flight. Default: 8.
	Concurrency int `yaml:"concurrency"`
	// PublishTimeout bounds one Send inside the caller's
	// deadline (the relay's --publish-timeout); 0 leaves the bound to the
	// caller (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
}

func (c Config) withDefaults() Config {
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
	if c.TopicARN == "" {
		return errors.New("outbox: sns: topic_arn: required (arn:aws:sns:REGION:ACCOUNT:{topic})")
	}
	if _, err := sinkconf.ParseTemplate(c.TopicARN); err != nil {
		return fmt.Errorf("outbox: sns: topic_arn: %w", err)
	}
	return c.fields().Options().Validate("sns", LargestMessageBytes)
}

// ParseURL parses a --sink URL such as
// sns://?topic_arn=arn:aws:sns:eu-west-1:123456789012:{topic} into a
// validated Config (see sinkconf.ParseConfig for its parameters). The URL
// has no host or path: the topic ARN is a parameter, since it is a
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
	return awsbatch.CheckBase("sns", base, "topic_arn", "the topic ARN")
}

var params = sinkconf.NewParams("sns", "",
	sinkconf.Routing(sinkconf.String("topic_arn", func(c *Config) *string { return &c.TopicARN })),
).With(awsbatch.Params((*Config).fields)...)

// fields points at the options the SQS and SNS sinks share.
func (c *Config) fields() awsbatch.Fields {
	return awsbatch.Fields{Region: &c.Region, Endpoint: &c.Endpoint, AccessKeyID: &c.AccessKeyID, SecretAccessKey: &c.SecretAccessKey,
		BodyEncoding: &c.BodyEncoding, MaxMessageBytes: &c.MaxMessageBytes, Concurrency: &c.Concurrency, PublishTimeout: &c.PublishTimeout}
}

// Redacted returns the configuration as a --sink URL with the secret key
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	return redact.URL("sns://?" + params.Query(&c).Encode())
}

// Target is the identity of c's destination (see sinks.Targeter): the topic ARN, the region and endpoint, and the body encoding,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, "sns://")
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }
