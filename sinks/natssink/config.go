package natssink

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultSubject = "{topic}"
	DefaultName    = "outbox-relay"
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout   = sinks.DefaultSendTimeout
	DefaultDialTimeout      = 10 * time.Second
	DefaultReconnectInitial = 100 * time.Millisecond
	DefaultReconnectMax     = 10 * time.Second
	DefaultMaxPending       = 4096
	// DefaultDuplicateWindow is the duplicate window of a stream the sink
	// creates (create_stream), JetStream's own default.
	DefaultDuplicateWindow = 2 * time.Minute
)

// Values of Config.Ordering.
const (
	OrderingStrict    = "strict"
	OrderingPipelined = "pipelined"
)

// Headers the sink sets besides the application's.
const (
	// HeaderMsgID carries the message id; JetStream drops a second message
	// with the same id inside the stream's duplicate window.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderKey carries the outbox key (set only when the key is not
	// empty).
	HeaderKey = wire.Key
	// HeaderSeq carries the message's position (sinks.Message.Seq, the
	// outbox row's id) in decimal. A key's messages carry growing
	// positions in the order they were written; consumers (the inbox
	// package) use it to tell a late redelivery from a new message. It
	// replaces an application header of the same name.
	HeaderSeq = wire.Seq
)

// Config configures the NATS JetStream sink. Zero values select the
// defaults documented on each field. Every field can also be set as a
// query parameter of the --sink URL under its yaml name (TLS fields as
// tls_ca_file, ...).
type Config struct {
	// URL is the server list, nats://[user:password@]host:port[,host:port].
	// Credentials must be percent-encoded; a user name without a password
	// is sent as a token. It has no query string: options are the fields
	// below. Required.
	URL string `yaml:"url"`
	// Subject is a template for each message's subject: literal text plus
	// {topic}, {key} and {header:NAME}. A stream must cover the subjects.
	// Default: "{topic}".
	Subject string `yaml:"subject"`
	// Stream, when set, is the stream every message must land in: a
	// message stored by another stream is refused by the server
	// (Nats-Expected-Stream) and dead-lettered. Default: any stream.
	Stream string `yaml:"stream"`
	// CreateStream creates Stream at start-up when it does not exist,
	// covering StreamSubjects, with DuplicateWindow. An existing stream is
	// left as it is. Default: false (the stream is the operator's).
	CreateStream bool `yaml:"create_stream"`
	// StreamSubjects are the subjects of a stream created by CreateStream,
	// comma-separated ("orders.>,billing.>"). No default: required with
	// create_stream.
	StreamSubjects string `yaml:"stream_subjects"`
	// DuplicateWindow is the duplicate window of a stream created by
	// CreateStream. Default: 2m.
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	// Token authenticates with a token. Default: none.
	Token sinkconf.Secret `yaml:"token"`
	// NKeySeedFile authenticates with the NKey seed in this file.
	// Default: none.
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// CredsFile authenticates with a JWT and NKey credentials file.
	// Default: none.
	CredsFile string `yaml:"creds_file"`
	// Name is the client name the server shows (connz). Default:
	// "outbox-relay".
	Name string `yaml:"name"`
	// PublishTimeout bounds one Send (waiting for the connection,
	// publishing, waiting for every ack) inside the caller's deadline
	// (the relay's --publish-timeout); 0 leaves the bound to the caller
	// (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// DialTimeout bounds one connection attempt. Default: 10s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// ReconnectInitial is the first delay between reconnection attempts;
	// it doubles (with jitter) up to ReconnectMax. The sink reconnects
	// forever. Default: 100ms.
	ReconnectInitial time.Duration `yaml:"reconnect_initial"`
	// ReconnectMax caps the delay between reconnection attempts.
	// Default: 10s.
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// Ordering is "strict" or "pipelined". Strict publishes a batch in
	// rounds (the r-th message of every key in round r), so that a later
	// message of a key is never stored before an earlier one that failed;
	// one key's messages cost one round trip each. Pipelined publishes the
	// whole batch at once, in batch order on the one connection: the
	// server stores a connection's messages in order, so order per key
	// holds unless the stream refuses a message and then accepts a later
	// one of the same batch (a stream with discard new that frees space
	// mid-batch, a cluster leader change); the sink then logs a warning
	// naming the key. Default: "strict".
	Ordering string `yaml:"ordering"`
	// MaxPending is the most publishes awaiting their ack, over all Sends.
	// Default: 4096.
	MaxPending int `yaml:"max_pending"`
	// TLS configures TLS (and mTLS with a client certificate), see
	// sinkconf.TLS: any TLS field, or tls=true, turns TLS on. Default: off
	// unless the server requires it.
	TLS sinkconf.TLS `yaml:"tls"`
}

// TLSConfig is the TLS section, the one every sink that dials a broker
// shares (see sinkconf.TLS).
type TLSConfig = sinkconf.TLS

func (c Config) withDefaults() Config {
	if c.Subject == "" {
		c.Subject = DefaultSubject
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	c.ReconnectInitial, c.ReconnectMax = sinkconf.ReconnectDefaults(c.ReconnectInitial, c.ReconnectMax, DefaultReconnectInitial, DefaultReconnectMax)
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.Ordering == "" {
		c.Ordering = OrderingStrict
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	return c
}

// Validate reports the first problem in c, naming the field. Errors never
// contain a password or token.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("outbox: nats: url: required")
	}
	if _, err := servers(c.URL); err != nil {
		return fmt.Errorf("outbox: nats: url: %w", err)
	}
	if c.Subject != "" {
		if _, err := sinkconf.ParseTemplate(c.Subject); err != nil {
			return fmt.Errorf("outbox: nats: subject: %w", err)
		}
	}
	if c.Stream != "" && !validStreamName(c.Stream) {
		return fmt.Errorf("outbox: nats: stream: %q is not a stream name (no spaces, dots, '*', '>', '/' or '\\')", redact.URL(c.Stream))
	}
	if c.CreateStream {
		if c.Stream == "" {
			return errors.New("outbox: nats: stream: required with create_stream")
		}
		if strings.TrimSpace(c.StreamSubjects) == "" {
			return errors.New("outbox: nats: stream_subjects: required with create_stream")
		}
	} else if c.StreamSubjects != "" {
		return errors.New("outbox: nats: stream_subjects: set, but create_stream is false")
	}
	if err := sinkconf.CheckDurations("nats", sinkconf.Dur("publish_timeout", c.PublishTimeout),
		sinkconf.Dur("dial_timeout", c.DialTimeout), sinkconf.Dur("reconnect_initial", c.ReconnectInitial),
		sinkconf.Dur("reconnect_max", c.ReconnectMax), sinkconf.Dur("duplicate_window", c.DuplicateWindow)); err != nil {
		return err
	}
	if err := sinkconf.CheckReconnect("nats", c.ReconnectInitial, c.ReconnectMax); err != nil {
		return err
	}
	switch c.Ordering {
	case "", OrderingStrict, OrderingPipelined:
	default:
		return fmt.Errorf("outbox: nats: ordering: must be %q or %q, got %q", OrderingStrict, OrderingPipelined, redact.URL(c.Ordering))
	}
	if c.MaxPending < 0 {
		return fmt.Errorf("outbox: nats: max_pending: must not be negative, got %d", c.MaxPending)
	}
	n := 0
	for _, set := range []bool{c.Token != "", c.NKeySeedFile != "", c.CredsFile != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return errors.New("outbox: nats: token: token, nkey_seed_file and creds_file are exclusive")
	}
	return c.TLS.Validate("nats", "")
}

func validStreamName(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\r\n.*>/\\")
}

// servers splits the URL into one URL per server (credentials copied to
// each), for nats.Connect. Errors never repeat the URL.
func servers(raw string) ([]string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(`not a valid URL (percent-encode reserved characters such as "?", "#", "@", "/" in the user name and password)`)
	}
	if u.Scheme != "nats" {
		return nil, fmt.Errorf("scheme must be nats, got %q", u.Scheme)
	}
	if u.RawQuery != "" || u.ForceQuery {
		return nil, errors.New("must not have a query string (options are config fields)")
	}
	if u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, errors.New("must not have a path or fragment")
	}
	if u.Host == "" {
		return nil, errors.New("host is missing (nats://host:4222)")
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, errors.New("empty server in the list")
		}
		if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
			if n, err := strconv.Atoi(h[i+1:]); err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("port must be between 1 and 65535, got %q", h[i+1:])
			}
		}
		s := url.URL{Scheme: "nats", Host: h}
		out = append(out, s.String())
	}
	return out, nil
}

// ParseURL parses a --sink URL such as
// nats://127.0.0.1:4222?subject=events.{topic}&stream=EVENTS into a
// validated Config (see sinkconf.ParseConfig for its parameters).
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, setBase)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, setBase)
}

func setBase(c *Config, base string) error { c.URL = base; return nil }

var params = sinkconf.NewParams("nats", "",
	sinkconf.Routing(sinkconf.String("subject", func(c *Config) *string { return &c.Subject })),
	sinkconf.Routing(sinkconf.String("stream", func(c *Config) *string { return &c.Stream })),
	sinkconf.Bool("create_stream", func(c *Config) *bool { return &c.CreateStream }),
	sinkconf.String("stream_subjects", func(c *Config) *string { return &c.StreamSubjects }),
	sinkconf.Duration("duplicate_window", func(c *Config) *time.Duration { return &c.DuplicateWindow }),
	sinkconf.Func("token",
		func(c *Config, v string) error { c.Token = sinkconf.Secret(v); return nil },
		func(c *Config) string { return c.Token.String() }),
	sinkconf.String("nkey_seed_file", func(c *Config) *string { return &c.NKeySeedFile }),
	sinkconf.String("creds_file", func(c *Config) *string { return &c.CredsFile }),
	sinkconf.String("name", func(c *Config) *string { return &c.Name }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
	sinkconf.Duration("dial_timeout", func(c *Config) *time.Duration { return &c.DialTimeout }),
	sinkconf.Duration("reconnect_initial", func(c *Config) *time.Duration { return &c.ReconnectInitial }),
	sinkconf.Duration("reconnect_max", func(c *Config) *time.Duration { return &c.ReconnectMax }),
	sinkconf.String("ordering", func(c *Config) *string { return &c.Ordering }),
	sinkconf.Int("max_pending", func(c *Config) *int { return &c.MaxPending }),
).With(sinkconf.TLSParams(func(c *Config) *sinkconf.TLS { return &c.TLS })...)

// Redacted returns the configuration as a --sink URL with every secret
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return "nats://(invalid url)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), sinkconf.Redacted)
		} else {
			u.User = url.User(sinkconf.Redacted) // a lone user name is a token
		}
	}
	u.RawQuery = params.Query(&c).Encode()
	return redact.URL(u.String())
}

// Target is the identity of c's destination (see sinks.Targeter): the servers, the subject and the stream,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, c.URL)
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// tlsConfig builds the client TLS configuration, or nil when TLS is off.
func (c Config) tlsConfig() (*tls.Config, error) { return c.TLS.Client("nats", false, "") }
