package redissink

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
	DefaultStream     = "{topic}"
	DefaultClientName = "outbox-relay"
	// DefaultPublishTimeout bounds a Send when publish_timeout is unset and
	// the caller set no deadline.
	DefaultPublishTimeout = sinks.DefaultSendTimeout
	DefaultDialTimeout    = 5 * time.Second
)

// Entry fields the sink writes besides one per header.
const (
	FieldID      = "id"      // the message id
	FieldKey     = "key"     // the outbox key, absent when the message has none
	FieldPayload = "payload" // the payload, byte for byte
	// FieldSeq is the message's position (sinks.Message.Seq, the outbox
	// row's id) in decimal. A key's messages carry growing positions in
	// the order they were written; consumers (the inbox package) use it to
	// tell a late redelivery from a new message.
	FieldSeq = wire.Seq
)

// Config configures the Redis Streams sink. Zero values select the
// defaults documented on each field. Every field can also be set as a
// query parameter of the --sink URL under its yaml name (TLS fields as
// tls_ca_file, ...).
type Config struct {
	// URL is the server, redis://[user:password@]host:port[/db] or
	// rediss://... for TLS; with Cluster, a list of seed nodes
	// redis://host:port,host:port (no db). Credentials must be
	// percent-encoded. It has no query string: options are the fields
	// below. Required.
	URL string `yaml:"url"`
	// Stream is a template for each message's stream key: literal text
	// plus {topic}, {key} and {header:NAME}. Default: "{topic}".
	Stream string `yaml:"stream"`
	// MaxLen trims each stream to about this many entries on every add
	// (XADD MAXLEN ~ N). Default: no trimming by length.
	MaxLen int `yaml:"maxlen"`
	// MaxAge trims entries older than this on every add (XADD MINID ~
	// server time − MaxAge). Exclusive with MaxLen. Default: no trimming
	// by age.
	MaxAge time.Duration `yaml:"max_age"`
	// HeaderPrefix is put before every header's field name, so that
	// headers cannot clash with the fields id, key and payload. A header
	// whose field would clash is dead-lettered. Default: "" (none).
	HeaderPrefix string `yaml:"header_prefix"`
	// Cluster connects to a Redis Cluster through the seed nodes of URL.
	// Default: false.
	Cluster bool `yaml:"cluster"`
	// ClientName is the name the server shows (CLIENT LIST). Default:
	// "outbox-relay".
	ClientName string `yaml:"client_name"`
	// PublishTimeout bounds one Send inside the caller's
	// deadline (the relay's --publish-timeout); 0 leaves the bound to the
	// caller (see sinks.SendContext). Default: 0.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// DialTimeout bounds one connection attempt. Default: 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// TLS configures rediss:// connections (see sinkconf.TLS): setting it
	// with a redis:// URL is an error. Default: system roots, no client
	// certificate, server name from the URL.
	TLS sinkconf.TLS `yaml:"tls"`
}

// TLSConfig is the TLS section, the one every sink that dials a broker
// shares (see sinkconf.TLS).
type TLSConfig = sinkconf.TLS

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.ClientName == "" {
		c.ClientName = DefaultClientName
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	return c
}

// Validate reports the first problem in c, naming the field. Errors never
// contain the password.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("outbox: redis: url: required")
	}
	u, err := parseServer(c.URL, c.Cluster)
	if err != nil {
		return fmt.Errorf("outbox: redis: url: %w", err)
	}
	if c.Stream != "" {
		if _, err := sinkconf.ParseTemplate(c.Stream); err != nil {
			return fmt.Errorf("outbox: redis: stream: %w", err)
		}
	}
	if c.MaxLen < 0 {
		return fmt.Errorf("outbox: redis: maxlen: must not be negative, got %d", c.MaxLen)
	}
	if c.MaxAge < 0 {
		return fmt.Errorf("outbox: redis: max_age: must not be negative, got %s", c.MaxAge)
	}
	if c.MaxAge != 0 && c.MaxAge < time.Millisecond {
		return fmt.Errorf("outbox: redis: max_age: must be at least 1ms, got %s", c.MaxAge)
	}
	if c.MaxLen > 0 && c.MaxAge > 0 {
		return errors.New("outbox: redis: maxlen: maxlen and max_age are exclusive (XADD takes one trimming strategy)")
	}
	if err := sinkconf.CheckDurations("redis", sinkconf.Dur("publish_timeout", c.PublishTimeout), sinkconf.Dur("dial_timeout", c.DialTimeout)); err != nil {
		return err
	}
	plain := ""
	if u.Scheme == "redis" {
		plain = u.Scheme
	}
	return c.TLS.Validate("redis", plain)
}

// server is the parsed URL.
type server struct {
	Scheme   string
	Addrs    []string
	Username string
	Password string
	DB       int
}

// parseServer parses the URL. Its errors never repeat it.
func parseServer(raw string, cluster bool) (server, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return server{}, errors.New(`not a valid URL (percent-encode reserved characters such as "?", "#", "@", "/" in the user name and password)`)
	}
	s := server{Scheme: u.Scheme}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return s, fmt.Errorf("scheme must be redis or rediss, got %q", u.Scheme)
	}
	if u.RawQuery != "" || u.ForceQuery {
		return s, errors.New("must not have a query string (options are config fields)")
	}
	if u.Fragment != "" {
		return s, errors.New("must not have a fragment")
	}
	if u.Host == "" {
		return s, errors.New("host is missing (redis://host:6379/0)")
	}
	for _, h := range strings.Split(u.Host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return s, errors.New("empty host in the list")
		}
		if !strings.Contains(h, ":") || strings.HasSuffix(h, "]") {
			h += ":6379"
		}
		i := strings.LastIndexByte(h, ':')
		if n, err := strconv.Atoi(h[i+1:]); err != nil || n < 1 || n > 65535 {
			return s, fmt.Errorf("port must be between 1 and 65535, got %q", h[i+1:])
		}
		s.Addrs = append(s.Addrs, h)
	}
	if len(s.Addrs) > 1 && !cluster {
		return s, errors.New("several hosts need cluster=true")
	}
	if u.User != nil {
		s.Username = u.User.Username()
		s.Password, _ = u.User.Password()
	}
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		db, err := strconv.Atoi(p)
		if err != nil || db < 0 {
			return s, fmt.Errorf("database must be a number, got %q", redact.URL(p))
		}
		if cluster && db != 0 {
			return s, errors.New("a cluster has only database 0")
		}
		s.DB = db
	}
	return s, nil
}

// ParseURL parses a --sink URL such as
// redis://127.0.0.1:6379/0?stream=events.{topic}&maxlen=1000000 into a
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

var params = sinkconf.NewParams("redis", "",
	sinkconf.Routing(sinkconf.String("stream", func(c *Config) *string { return &c.Stream })),
	sinkconf.Int("maxlen", func(c *Config) *int { return &c.MaxLen }),
	sinkconf.Duration("max_age", func(c *Config) *time.Duration { return &c.MaxAge }),
	sinkconf.Routing(sinkconf.String("header_prefix", func(c *Config) *string { return &c.HeaderPrefix })),
	sinkconf.Bool("cluster", func(c *Config) *bool { return &c.Cluster }),
	sinkconf.String("client_name", func(c *Config) *string { return &c.ClientName }),
	sinkconf.Duration("publish_timeout", func(c *Config) *time.Duration { return &c.PublishTimeout }),
	sinkconf.Duration("dial_timeout", func(c *Config) *time.Duration { return &c.DialTimeout }),
).With(sinkconf.TLSParams(func(c *Config) *sinkconf.TLS { return &c.TLS })...)

// Redacted returns the configuration as a --sink URL with the password
// replaced by "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return "redis://(invalid url)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), sinkconf.Redacted)
		}
	}
	u.RawQuery = params.Query(&c).Encode()
	return redact.URL(u.String())
}

// Target is the identity of c's destination (see sinks.Targeter): the server and its database, the stream and the header
// prefix,
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, c.URL)
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// tlsConfig builds the client TLS configuration, or nil for redis://.
func (c Config) tlsConfig(srv server) (*tls.Config, error) {
	host := ""
	if len(srv.Addrs) == 1 {
		host, _, _ = strings.Cut(srv.Addrs[0], ":")
	}
	return c.TLS.Client("redis", srv.Scheme == "rediss", host)
}
