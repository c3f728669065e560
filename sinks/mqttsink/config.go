package mqttsink

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultTopic = "{topic}"
	// DefaultClientIDPrefix starts the client id when ClientID is unset;
	// a random suffix makes it unique, so that two relays never take
	// over each other's connection.
	DefaultClientIDPrefix = "outbox-relay-"
	DefaultKeepAlive      = 30 * time.Second
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout   = sinks.DefaultSendTimeout
	DefaultConnectTimeout   = 10 * time.Second
	DefaultReconnectInitial = 100 * time.Millisecond
	DefaultReconnectMax     = 10 * time.Second
)

// User properties the sink sets besides the application's headers. An
// application header of the same name is replaced.
const (
	// PropID carries the message id, the same on every attempt:
	// consumers deduplicate on it.
	PropID = wire.ID
	// PropSeq carries the message's position (sinks.Message.Seq, the
	// outbox row's id) in decimal. A key's messages carry growing
	// positions in the order they were written; consumers (the inbox
	// package) use it to tell a late redelivery from a new message.
	PropSeq = wire.Seq
	// PropKey carries the outbox key (set only when the key is not
	// empty).
	PropKey = wire.Key
	// HeaderContentType, when an application header (matched without
	// regard to case), goes out as the MQTT Content Type property, not as
	// a user property: the CloudEvents format puts datacontenttype there.
	HeaderContentType = "content-type"
)

// Config configures the MQTT 5 sink. Zero values select the defaults
// documented on each field. Every field can also be set as a query
// parameter of the --sink URL under its yaml name (TLS fields as
// tls_ca_file, ...).
type Config struct {
	// URL is the broker list, mqtt://[user[:password]@]host[:port][,host[:port]]
	// (port 1883) or mqtts://... (TLS, port 8883). The sink connects to
	// the first broker that answers, in order. Credentials must be
	// percent-encoded. It has no query string: options are the fields
	// below. Required.
	URL string `yaml:"url"`
	// Topic is a template for each message's MQTT topic: literal text
	// plus {topic}, {key} and {header:NAME}. A rendered topic that is
	// empty or has a wildcard ('+', '#') is refused (permanent).
	// Default: "{topic}".
	Topic string `yaml:"topic"`
	// ClientID is the MQTT client id. Two clients with one id take the
	// connection from each other, so each relay needs its own. Default:
	// "outbox-relay-" and 12 random hex digits, new for each sink.
	ClientID string `yaml:"client_id"`
	// Username authenticates the connection (also from the URL's user
	// name). Default: none.
	Username string `yaml:"username"`
	// Password goes with Username (also from the URL). Default: none.
	Password sinkconf.Secret `yaml:"password"`
	// KeepAlive is the MQTT keep alive: the broker drops a connection
	// silent for 1.5 times as long, the client pings before. Whole
	// seconds, at most 65535s. Default: 30s.
	KeepAlive time.Duration `yaml:"keepalive"`
	// SessionExpiry is the session expiry interval the sink asks for:
	// how long the broker keeps the session (and the client resends its
	// unacknowledged messages) after a connection drops. Whole seconds.
	// Default: 0 (the session ends with the connection; the relay
	// retries what was not acknowledged).
	SessionExpiry time.Duration `yaml:"session_expiry"`
	// PublishTimeout bounds one Send: waiting for the connection,
	// publishing and waiting for every PUBACK. When 0 (unset), a Send is
	// bounded by the caller's deadline alone (the relay's
	// --publish-timeout), or by DefaultPublishTimeout when the caller set
	// none (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// ConnectTimeout bounds one connection attempt (TCP, TLS and
	// CONNECT/CONNACK). Default: 10s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ReconnectInitial is the first delay between reconnection rounds; it
	// doubles (with jitter) up to ReconnectMax. The sink reconnects
	// forever. Default: 100ms.
	ReconnectInitial time.Duration `yaml:"reconnect_initial"`
	// ReconnectMax caps the delay between reconnection rounds.
	// Default: 10s.
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// TLS configures TLS (and mTLS with a client certificate), see
	// sinkconf.TLS. It needs the mqtts scheme, which turns TLS on by
	// itself. Default: off.
	TLS sinkconf.TLS `yaml:"tls"`
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.ClientID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		c.ClientID = DefaultClientIDPrefix + hex.EncodeToString(b[:])
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	c.ReconnectInitial, c.ReconnectMax = sinkconf.ReconnectDefaults(c.ReconnectInitial, c.ReconnectMax, DefaultReconnectInitial, DefaultReconnectMax)
	return c
}

// Validate reports the first problem in c, naming the field. Errors never
// contain a password.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("outbox: mqtt: url: required")
	}
	b, err := parseBrokers(c.URL)
	if err != nil {
		return fmt.Errorf("outbox: mqtt: url: %w", err)
	}
	if c.Topic != "" {
		t, err := sinkconf.ParseTemplate(c.Topic)
		if err != nil {
			return fmt.Errorf("outbox: mqtt: topic: %w", err)
		}
		// The literal text alone is checked here; what the message adds
		// is checked for each message.
		if lit := t.Render("", "", nil); strings.ContainsAny(lit, "+#\x00") {
			return fmt.Errorf("outbox: mqtt: topic: %q has a wildcard ('+', '#') or NUL; a message's topic name has none", redact.URL(c.Topic))
		}
	}
	if c.ClientID != "" && (!utf8.ValidString(c.ClientID) || len(c.ClientID) > 65535 || strings.ContainsRune(c.ClientID, 0)) {
		return errors.New("outbox: mqtt: client_id: must be UTF-8 without NUL, at most 65535 bytes")
	}
	if b.user != "" && c.Username != "" {
		return errors.New("outbox: mqtt: username: set both in the url and as a field; set one")
	}
	if b.hasPassword && c.Password != "" {
		return errors.New("outbox: mqtt: password: set both in the url and as a field; set one")
	}
	if err := sinkconf.CheckDurations("mqtt", sinkconf.Dur("keepalive", c.KeepAlive).AtMost(65535*time.Second),
		sinkconf.Dur("session_expiry", c.SessionExpiry).AtMost((1<<32-1)*time.Second),
		sinkconf.Dur("publish_timeout", c.PublishTimeout), sinkconf.Dur("connect_timeout", c.ConnectTimeout),
		sinkconf.Dur("reconnect_initial", c.ReconnectInitial), sinkconf.Dur("reconnect_max", c.ReconnectMax)); err != nil {
		return err
	}
	if c.KeepAlive%time.Second != 0 || c.SessionExpiry%time.Second != 0 {
		return errors.New("outbox: mqtt: keepalive, session_expiry: whole seconds")
	}
	if err := sinkconf.CheckReconnect("mqtt", c.ReconnectInitial, c.ReconnectMax); err != nil {
		return err
	}
	plain := ""
	if !b.tls {
		plain = "mqtt"
	}
	return c.TLS.Validate("mqtt", plain)
}

// brokers is the parsed URL.
type brokers struct {
	urls        []*url.URL // one per broker, without credentials
	tls         bool
	user        string
	password    string
	hasPassword bool
}

// parseBrokers splits the URL into one URL per broker. Errors never
// repeat the URL.
func parseBrokers(raw string) (brokers, error) {
	var b brokers
	u, err := url.Parse(raw)
	if err != nil {
		return b, errors.New(`not a valid URL (percent-encode reserved characters such as "?", "#", "@", "/" in the user name and password)`)
	}
	port := "1883"
	switch u.Scheme {
	case "mqtt":
	case "mqtts":
		b.tls, port = true, "8883"
	default:
		return b, fmt.Errorf("scheme must be mqtt or mqtts, got %q", redact.URL(u.Scheme))
	}
	if u.RawQuery != "" || u.ForceQuery {
		return b, errors.New("must not have a query string (options are config fields)")
	}
	if u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return b, errors.New("must not have a path or fragment")
	}
	if u.Host == "" {
		return b, errors.New("host is missing (mqtt://host:1883)")
	}
	if u.User != nil {
		b.user = u.User.Username()
		b.password, b.hasPassword = u.User.Password()
	}
	for _, h := range strings.Split(u.Host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return b, errors.New("empty broker in the list")
		}
		host, p, err := net.SplitHostPort(h)
		if err != nil {
			host, p = h, port
		} else if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return b, fmt.Errorf("port must be between 1 and 65535, got %q", redact.URL(p))
		}
		if host == "" {
			return b, errors.New("empty host in the list")
		}
		b.urls = append(b.urls, &url.URL{Scheme: u.Scheme, Host: net.JoinHostPort(strings.Trim(host, "[]"), p)})
	}
	return b, nil
}

// ParseURL parses a --sink URL such as
// mqtt://127.0.0.1:1883?topic=events/{topic} into a validated Config (see
// sinkconf.ParseConfig for its parameters).
func ParseURL(raw string) (Config, error) {
	return sinkconf.ParseConfig(params, raw, setBase)
}

// decodeURL is ParseURL without the validation, for Driver: the config
// file's section may complete the URL (see sinks.Typed).
func decodeURL(raw string) (Config, error) {
	return sinkconf.DecodeURL(params, raw, setBase)
}

func setBase(c *Config, base string) error { c.URL = base; return nil }

var params = sinkconf.NewParams("mqtt", "",
	sinkconf.Routing(sinkconf.String("topic", func(c *Config) *string { return &c.Topic })),
	sinkconf.String("client_id", func(c *Config) *string { return &c.ClientID }),
	sinkconf.String("username", func(c *Config) *string { return &c.Username }),
	sinkconf.Func("password",
		func(c *Config, v string) error { c.Password = sinkconf.Secret(v); return nil },
		func(c *Config) string { return c.Password.String() }),
	sinkconf.Duration("keepalive", func(c *Config) *time.Duration { return &c.KeepAlive }),
	sinkconf.Duration("session_expiry", func(c *Config) *time.Duration { return &c.SessionExpiry }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
	sinkconf.Duration("connect_timeout", func(c *Config) *time.Duration { return &c.ConnectTimeout }),
	sinkconf.Duration("reconnect_initial", func(c *Config) *time.Duration { return &c.ReconnectInitial }),
	sinkconf.Duration("reconnect_max", func(c *Config) *time.Duration { return &c.ReconnectMax }),
).With(sinkconf.TLSParams(func(c *Config) *sinkconf.TLS { return &c.TLS })...)

// Redacted returns the configuration as a --sink URL with every secret
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return "mqtt://(invalid url)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), sinkconf.Redacted)
		}
	}
	u.RawQuery = params.Query(&c).Encode()
	return redact.URL(u.String())
}

// Target is the identity of c's destination (see sinks.Targeter): the broker and the topic,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, c.URL)
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// credentials returns the user name and password, from the URL or the
// fields.
func (c Config) credentials(b brokers) (string, []byte) {
	user, pass := c.Username, string(c.Password)
	if b.user != "" {
		user = b.user
	}
	if b.hasPassword {
		pass = b.password
	}
	if pass == "" {
		return user, nil
	}
	return user, []byte(pass)
}

// tlsConfig builds the client TLS configuration, or nil when TLS is off.
func (c Config) tlsConfig(b brokers) (*tls.Config, error) {
	host := ""
	if len(b.urls) == 1 {
		host = b.urls[0].Hostname()
	}
	return c.TLS.Client("mqtt", b.tls, host)
}
