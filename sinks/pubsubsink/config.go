package pubsubsink

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultTopic          = "{topic}"
	DefaultEndpoint       = "pubsub.googleapis.com:443"
	DefaultPublishTimeout = 30 * time.Second

	DefaultReconnectInitial = 100 * time.Millisecond
	DefaultReconnectMax     = 10 * time.Second
)

// Limits of the service that the sink checks before sending.
const (
	MaxMessageBytes   = 10_000_000 // data, attributes and ordering key of one message
	MaxAttributes     = 100
	MaxAttrKeyBytes   = 256
	MaxAttrValueBytes = 1024
	MaxOrderingKey    = 1024
)

// Message attributes the sink sets on every message, besides one per
// header.
const (
	AttrID  = wire.ID  // the message id
	AttrSeq = wire.Seq // the message's position in the outbox; per key, it only grows
	AttrKey = wire.Key // the outbox key, absent when the message has none (also the ordering key)
)

// Config configures the Google Cloud Pub/Sub sink. Zero values select the
// defaults documented on each field. Every field but Project can also be
// set as a query parameter of the --sink URL under its yaml name:
// pubsub://PROJECT?topic=events.{topic}
type Config struct {
	// Project is the Google Cloud project of the topics (the URL's host).
	// Required.
	Project string `yaml:"project"`
	// Topic is a template for each message's topic ID: literal text plus
	// {topic}, {key} and {header:NAME}. Default: "{topic}".
	Topic string `yaml:"topic"`
	// Endpoint is the service's host:port. Set a regional endpoint
	// (us-east1-pubsub.googleapis.com:443) so that every relay publishes
	// a key's messages to the same region, as ordering keys require, or a
	// local emulator's address. Default: pubsub.googleapis.com:443.
	Endpoint string `yaml:"endpoint"`
	// Insecure connects in plain text without credentials, for an
	// emulator. Default: false (TLS, with credentials).
	Insecure bool `yaml:"insecure"`
	// CredentialsFile is a service account key (JSON). Default:
	// Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the
	// gcloud user, the metadata server of GCE, GKE and Cloud Run).
	CredentialsFile string `yaml:"credentials_file"`
	// PublishTimeout bounds one Send. Default: 30s.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// ReconnectInitial is the first delay before redialing the endpoint
	// after a failed dial or a lost connection; the delay grows (×1.6,
	// with jitter) up to ReconnectMax and resets after a successful dial.
	// While the client waits, Sends fail at once as not sent, so the
	// delay bounds how long after the endpoint is back the relay sees it
	// (gRPC's own default grows to 2 minutes). Default: 100ms.
	ReconnectInitial time.Duration `yaml:"reconnect_initial"`
	// ReconnectMax caps the delay between dial attempts. Default: 10s.
	ReconnectMax time.Duration `yaml:"reconnect_max"`
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	c.ReconnectInitial, c.ReconnectMax = sinkconf.ReconnectDefaults(c.ReconnectInitial, c.ReconnectMax, DefaultReconnectInitial, DefaultReconnectMax)
	return c
}

// Validate reports the first problem in c, naming the field.
func (c Config) Validate() error {
	if c.Project == "" {
		return errors.New("outbox: pubsub: project: required (pubsub://PROJECT)")
	}
	if c.Topic != "" {
		if _, err := sinkconf.ParseTemplate(c.Topic); err != nil {
			return fmt.Errorf("outbox: pubsub: topic: %w", err)
		}
	}
	if c.Endpoint != "" {
		if _, port, err := net.SplitHostPort(c.Endpoint); err != nil || port == "" {
			return fmt.Errorf("outbox: pubsub: endpoint: want host:port, got %q", redact.URL(c.Endpoint))
		}
	}
	if c.Insecure && c.CredentialsFile != "" {
		return errors.New("outbox: pubsub: insecure: sends no credentials; credentials_file would be ignored")
	}
	if err := sinkconf.CheckDurations("pubsub", sinkconf.Dur("publish_timeout", c.PublishTimeout),
		sinkconf.Dur("reconnect_initial", c.ReconnectInitial), sinkconf.Dur("reconnect_max", c.ReconnectMax)); err != nil {
		return err
	}
	return sinkconf.CheckReconnect("pubsub", c.ReconnectInitial, c.ReconnectMax)
}

// ParseURL parses a --sink URL such as
// pubsub://my-project?topic=events.{topic} into a validated Config: the
// host is the project (see sinkconf.ParseConfig for its parameters).
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, setProject)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, setProject)
}

// setProject takes the project from the URL's host, the URL's only part.
func setProject(c *Config, base string) error {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "pubsub" || u.User != nil || u.Port() != "" || strings.Trim(u.Path, "/") != "" {
		return fmt.Errorf("outbox: pubsub: url: want pubsub://PROJECT?topic=..., got %q", redact.URL(base))
	}
	c.Project = u.Host
	return nil
}

var params = sinkconf.NewParams("pubsub", "",
	sinkconf.Routing(sinkconf.String("topic", func(c *Config) *string { return &c.Topic })),
	sinkconf.Routing(sinkconf.String("endpoint", func(c *Config) *string { return &c.Endpoint })),
	sinkconf.Bool("insecure", func(c *Config) *bool { return &c.Insecure }),
	sinkconf.String("credentials_file", func(c *Config) *string { return &c.CredentialsFile }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
	sinkconf.Duration("reconnect_initial", func(c *Config) *time.Duration { return &c.ReconnectInitial }),
	sinkconf.Duration("reconnect_max", func(c *Config) *time.Duration { return &c.ReconnectMax }),
)

// Redacted returns the configuration as a --sink URL, for logs and error
// messages (it holds no secret: credentials are in a file).
func (c Config) Redacted() string {
	return redact.URL("pubsub://" + c.Project + "?" + params.Query(&c).Encode())
}

// Target is the identity of c's destination (see sinks.Targeter): the project, the topic and the endpoint,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, "pubsub://"+c.Project)
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }
