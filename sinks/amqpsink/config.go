package amqpsink

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultRoutingKey     = "{topic}"
	DefaultUnroutable     = UnroutablePermanent
	DefaultContentType    = "application/octet-stream"
	DefaultConnectionName = "outbox-relay"
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout   = sinks.DefaultSendTimeout
	DefaultDialTimeout      = 10 * time.Second
	DefaultHeartbeat        = 10 * time.Second
	DefaultReconnectInitial = 500 * time.Millisecond
	DefaultReconnectMax     = 10 * time.Second
	DefaultChannels         = 8
	// DefaultMaxMessageSize matches RabbitMQ's own default max_message_size
	// (128 MiB).
	DefaultMaxMessageSize = 128 << 20
)

// Values of Config.Unroutable.
const (
	// UnroutablePermanent dead-letters a message no queue is bound for.
	UnroutablePermanent = "permanent"
	// UnroutableRetry retries it with backoff, for topologies whose queues
	// appear later than the messages.
	UnroutableRetry = "retry"
)

// Values of Config.DeclareExchange.
const (
	// DeclareNone leaves the exchange alone.
	DeclareNone = "none"
	// DeclarePassive checks on every (re)connect that the exchange exists.
	DeclarePassive = "passive"
)

// DefaultExchangeName selects the broker's nameless default exchange, which
// routes a message to the queue named by its routing key.
const DefaultExchangeName = "amq.default"

// HeaderKey carries the outbox key of a message (AMQP has no key of its
// own). It is set only when the key is not empty.
const HeaderKey = wire.Key

// HeaderSeq carries the message's position (sinks.Message.Seq, the outbox
// row's id) as an AMQP long (int64). A key's messages carry growing
// positions in the order they were written; consumers (the inbox package)
// use it to tell a late redelivery from a new message. An application
// header with the same name is replaced.
const HeaderSeq = wire.Seq

// Config configures the RabbitMQ (AMQP 0-9-1) sink. The zero value of every
// field but URL and Exchange means "use the default" documented on it; New
// applies the defaults. Every field can also be set as a query parameter of
// the --sink URL under its yaml name (TLS fields as tls_ca_file, ...).
type Config struct {
	// URL is the broker address, amqp://user:pass@host:port/vhost or
	// amqps://... The vhost is the percent-decoded path ("/" when the path
	// is empty or "/"). Credentials must be percent-encoded. It has no
	// query string: options are the fields below. Required.
	URL string `yaml:"url"`
	// Exchange receives every message. "amq.default" selects the nameless
	// default exchange (routing key = queue name). Required: there is no
	// default, because publishing to the wrong exchange dead-letters
	// every message as unroutable.
	Exchange string `yaml:"exchange"`
	// RoutingKey is a template for each message's routing key: literal
	// text plus {topic}, {key} and {header:NAME} (empty when the message
	// has no such header). Default: "{topic}".
	RoutingKey string `yaml:"routing_key"`
	// Unroutable says what a message that reached no queue is: "permanent"
	// (dead-lettered at once) or "retry". Default: "permanent".
	Unroutable string `yaml:"unroutable"`
	// ContentType is the content-type property of messages that have no
	// "content-type" header of their own. Default: application/octet-stream.
	ContentType string `yaml:"content_type"`
	// DeclareExchange is "none" or "passive" (check on every connect that
	// the exchange exists; a missing exchange keeps the sink disconnected
	// and unhealthy until it is created). The sink never creates or
	// changes topology. Default: "none".
	DeclareExchange string `yaml:"declare_exchange"`
	// ConnectionName is the connection_name client property shown by the
	// broker (rabbitmqctl list_connections, management UI). Default:
	// "outbox-relay".
	ConnectionName string `yaml:"connection_name"`
	// PublishTimeout bounds one Send (waiting for a connection and a
	// channel, publishing, waiting for every confirm) inside the caller's
	// deadline (the relay's --publish-timeout); 0 leaves the bound to the
	// caller (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// DialTimeout bounds TCP connect, TLS and AMQP handshakes. Default: 10s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// Heartbeat is the AMQP heartbeat interval the sink proposes; a dead
	// broker is noticed after about three intervals. Default: 10s.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// ReconnectInitial is the first delay before redialing after the
	// connection was lost or a dial failed; it doubles (with jitter) up to
	// ReconnectMax and resets after a successful dial. Default: 500ms.
	ReconnectInitial time.Duration `yaml:"reconnect_initial"`
	// ReconnectMax caps the delay between dial attempts, and so how long
	// after an outage the sink takes to see the broker back. Default: 10s.
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// Channels is the number of AMQP channels on the one connection, that
	// is the number of Sends that publish at the same time; further Sends
	// wait for a free channel. Default: 8.
	Channels int `yaml:"channels"`
	// MaxMessageSize is the largest payload the sink publishes; a larger
	// message fails permanently without being sent. Set it to the broker's
	// max_message_size. Default: 134217728 (128 MiB, RabbitMQ's default).
	MaxMessageSize int `yaml:"max_message_size"`
	// TLS configures amqps:// connections (see sinkconf.TLS): setting it
	// with an amqp:// URL is an error. Default: system roots, no client
	// certificate, server name from the URL.
	TLS sinkconf.TLS `yaml:"tls"`
}

// TLSConfig is the TLS section, the one every sink that dials a broker
// shares (see sinkconf.TLS).
type TLSConfig = sinkconf.TLS

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.RoutingKey == "" {
		c.RoutingKey = DefaultRoutingKey
	}
	if c.Unroutable == "" {
		c.Unroutable = DefaultUnroutable
	}
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	if c.DeclareExchange == "" {
		c.DeclareExchange = DeclareNone
	}
	if c.ConnectionName == "" {
		c.ConnectionName = DefaultConnectionName
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	c.ReconnectInitial, c.ReconnectMax = sinkconf.ReconnectDefaults(c.ReconnectInitial, c.ReconnectMax, DefaultReconnectInitial, DefaultReconnectMax)
	if c.Channels == 0 {
		c.Channels = DefaultChannels
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	return c
}

// Validate reports the first problem in c, naming the field. Zero values
// other than URL and Exchange are valid (they select the defaults). Errors
// never contain the password.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("outbox: amqp: url: required")
	}
	u, err := checkURL(c.URL)
	if err != nil {
		return fmt.Errorf("outbox: amqp: url: %w", err)
	}
	if c.Exchange == "" {
		return fmt.Errorf("outbox: amqp: exchange: required (use %q for the default exchange)", DefaultExchangeName)
	}
	if len(c.Exchange) > 255 {
		return errors.New("outbox: amqp: exchange: longer than 255 bytes")
	}
	if c.RoutingKey != "" {
		if _, err := sinkconf.ParseTemplate(c.RoutingKey); err != nil {
			return fmt.Errorf("outbox: amqp: routing_key: %w", err)
		}
	}
	switch c.Unroutable {
	case "", UnroutablePermanent, UnroutableRetry:
	default:
		return fmt.Errorf("outbox: amqp: unroutable: must be %q or %q, got %q", UnroutablePermanent, UnroutableRetry, redact.URL(c.Unroutable))
	}
	if len(c.ContentType) > 255 || strings.ContainsFunc(c.ContentType, isControl) {
		return errors.New("outbox: amqp: content_type: longer than 255 bytes or contains control characters")
	}
	switch c.DeclareExchange {
	case "", DeclareNone, DeclarePassive:
	default:
		return fmt.Errorf("outbox: amqp: declare_exchange: must be %q or %q, got %q", DeclareNone, DeclarePassive, redact.URL(c.DeclareExchange))
	}
	if err := sinkconf.CheckDurations("amqp", sinkconf.Dur("publish_timeout", c.PublishTimeout),
		sinkconf.Dur("dial_timeout", c.DialTimeout), sinkconf.Dur("heartbeat", c.Heartbeat),
		sinkconf.Dur("reconnect_initial", c.ReconnectInitial), sinkconf.Dur("reconnect_max", c.ReconnectMax)); err != nil {
		return err
	}
	if err := sinkconf.CheckReconnect("amqp", c.ReconnectInitial, c.ReconnectMax); err != nil {
		return err
	}
	if c.Channels < 0 || c.Channels > 2047 {
		return fmt.Errorf("outbox: amqp: channels: must be between 1 and 2047, got %d", c.Channels)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("outbox: amqp: max_message_size: must not be negative, got %d", c.MaxMessageSize)
	}
	plain := ""
	if u.Scheme == "amqp" {
		plain = u.Scheme
	}
	return c.TLS.Validate("amqp", plain)
}

// checkURL validates the broker address. Its errors never repeat the URL,
// which holds the password.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(`not a valid URL (percent-encode reserved characters such as "?", "#", "@", "/" in the user name and password)`)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return nil, fmt.Errorf("scheme must be amqp or amqps, got %q", u.Scheme)
	}
	if u.RawQuery != "" || u.ForceQuery {
		return nil, errors.New("must not have a query string (options are config fields)")
	}
	if u.Fragment != "" {
		return nil, errors.New("must not have a fragment")
	}
	if u.Hostname() == "" {
		return nil, errors.New("host is missing")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("port must be between 1 and 65535, got %q", p)
		}
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return nil, errors.New("not a valid AMQP URI (check the port and vhost)")
	}
	return u, nil
}

// ParseURL parses a --sink URL such as
// amqp://guest:guest@127.0.0.1:5672/?exchange=events&routing_key=orders.{topic}
// into a validated Config (see sinkconf.ParseConfig for its parameters).
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, setBase)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, setBase)
}

func setBase(c *Config, base string) error { c.URL = base; return nil }

// params are the URL query parameters, every Config field under its yaml
// name (TLS fields with a tls_ prefix); Redacted shows them back.
var params = sinkconf.NewParams("amqp", "",
	sinkconf.Routing(sinkconf.String("exchange", func(c *Config) *string { return &c.Exchange })),
	sinkconf.Routing(sinkconf.String("routing_key", func(c *Config) *string { return &c.RoutingKey })),
	sinkconf.String("unroutable", func(c *Config) *string { return &c.Unroutable }),
	sinkconf.Routing(sinkconf.String("content_type", func(c *Config) *string { return &c.ContentType })),
	sinkconf.String("declare_exchange", func(c *Config) *string { return &c.DeclareExchange }),
	sinkconf.String("connection_name", func(c *Config) *string { return &c.ConnectionName }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
	sinkconf.Duration("dial_timeout", func(c *Config) *time.Duration { return &c.DialTimeout }),
	sinkconf.Duration("heartbeat", func(c *Config) *time.Duration { return &c.Heartbeat }),
	sinkconf.Duration("reconnect_initial", func(c *Config) *time.Duration { return &c.ReconnectInitial }),
	sinkconf.Duration("reconnect_max", func(c *Config) *time.Duration { return &c.ReconnectMax }),
	sinkconf.Int("channels", func(c *Config) *int { return &c.Channels }),
	sinkconf.Int("max_message_size", func(c *Config) *int { return &c.MaxMessageSize }),
).With(sinkconf.TLSParams(func(c *Config) *sinkconf.TLS { return &c.TLS })...)

// Redacted returns the configuration as a --sink URL with the password
// (and anything else redact.URL takes for a credential) replaced by
// "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return "amqp://(invalid url)"
	}
	u.RawQuery = params.Query(&c).Encode()
	return redact.URL(u.String())
}

// Target is the identity of c's destination (see sinks.Targeter): the broker and its vhost, the exchange, the routing key and the
// content type,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, c.URL)
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// tlsConfig builds the client TLS configuration, or nil for amqp://.
func (c Config) tlsConfig() (*tls.Config, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, nil
	}
	return c.TLS.Client("amqp", u.Scheme == "amqps", u.Hostname())
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
