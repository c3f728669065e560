package httpsink

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultContentType           = "application/octet-stream"
	DefaultTimeout               = 30 * time.Second
	DefaultDialTimeout           = 5 * time.Second
	DefaultTLSHandshakeTimeout   = 10 * time.Second
	DefaultResponseHeaderTimeout = 30 * time.Second
	DefaultMaxRetryAfter         = 10 * time.Minute
	DefaultMaxConcurrency        = 16
)

// Config configures the HTTP webhook sink. The zero value of every field
// means "use the default" documented on it; New applies the defaults.
type Config struct {
	// URL receives every message whose topic matches no route. Optional when
	// Routes is set; a message that matches no route and has no default URL
	// fails permanently. Query parameters and userinfo (basic auth) are
	// sent as written. Default: none.
	URL string `yaml:"url"`
	// Routes maps topic patterns to URLs; the first matching route wins.
	// Default: none (every message goes to URL).
	Routes []Route `yaml:"routes"`
	// ContentType is the Content-Type of every request whose message has no
	// "content-type" header of its own. Default: application/octet-stream.
	ContentType string `yaml:"content_type"`
	// Secrets are Standard Webhooks signing secrets ("whsec_" followed by
	// the base64 key, at least 24 bytes). Each request carries one v1
	// signature per secret in webhook-signature, so a receiver can rotate
	// its secret without downtime: list the new secret and the old one
	// until the receiver has switched. Default: none (no signature header).
	Secrets []sinkconf.Secret `yaml:"secrets"`
	// Timeout bounds one request from dial to the end of the response
	// body. Default: 30s.
	Timeout time.Duration `yaml:"timeout"`
	// DialTimeout bounds establishing the TCP connection. Default: 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// TLSHandshakeTimeout bounds the TLS handshake. Default: 10s.
	TLSHandshakeTimeout time.Duration `yaml:"tls_handshake_timeout"`
	// ResponseHeaderTimeout bounds the wait for the response headers after
	// the request was written. Default: 30s (Timeout still applies).
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout"`
	// MaxRetryAfter caps the delay a receiver can ask for with Retry-After.
	// Default: 10m.
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
	// MaxConcurrency is the maximum number of requests in flight to one
	// host (scheme, host and port), shared by all concurrent Sends.
	// Default: 16.
	MaxConcurrency int `yaml:"max_concurrency"`
	// RateLimit bounds the requests to one host (scheme, host and port),
	// in requests a second, shared by all concurrent Sends of the sink (of
	// this process: with several relays, give each its share). A request
	// waits for its turn before it takes one of max_concurrency's slots.
	// 0: no limit. Default: 0.
	RateLimit float64 `yaml:"rate_limit"`
	// RateBurst is how many requests may go to a host at once under
	// rate_limit. Default: rate_limit rounded up (at least 1).
	RateBurst int `yaml:"rate_burst"`
	// RetryStatuses lists extra status codes (400-599) treated as retriable
	// instead of permanent, for receivers that answer 404 or 409 while
	// they deploy. Default: none.
	RetryStatuses []int `yaml:"retry_statuses"`
	// Retry4xx treats every 4xx answer as retriable. Default: false (only
	// 408, 425 and 429 are retried).
	Retry4xx bool `yaml:"retry_4xx"`
	// AllowInsecureHTTP permits http:// URLs to hosts other than loopback
	// addresses and "localhost". Default: false.
	AllowInsecureHTTP bool `yaml:"allow_insecure_http"`
	// BlockPrivateNetworks refuses to connect to the addresses of IANA's
	// IPv4 and IPv6 special-purpose registries (loopback, private,
	// link-local, carrier-grade NAT, NAT64, 6to4, Teredo, documentation,
	// ...), to multicast and to IPv6 outside global unicast, on any port,
	// checked on the resolved address at dial time (so DNS cannot be used
	// to reach internal services). Default: false.
	BlockPrivateNetworks bool `yaml:"block_private_networks"`
}

// Route sends messages whose topic matches Topic to URL.
type Route struct {
	// Topic is a topic pattern (package topic, the language of relay
	// routes too: '*' any run of characters, '?' one character), for
	// example "orders.*". '[', ']' and '\\' are refused: webhook routes
	// once read them as path.Match classes and escapes, which the language
	// does not have, and a pattern that silently changed meaning would
	// send messages elsewhere. Required.
	Topic string `yaml:"topic"`
	// URL receives the matching messages. Required.
	URL string `yaml:"url"`
}

// errReserved explains why a webhook route's pattern with '[', ']' or '\'
// is refused.
var errReserved = errors.New("'[', ']' and '\\' are reserved (webhook routes no longer take path.Match classes or escapes; see package topic)")

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.TLSHandshakeTimeout == 0 {
		c.TLSHandshakeTimeout = DefaultTLSHandshakeTimeout
	}
	if c.ResponseHeaderTimeout == 0 {
		c.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.RateLimit > 0 && c.RateBurst == 0 {
		c.RateBurst = max(1, int(math.Ceil(c.RateLimit)))
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	return c
}

// Validate reports the first problem in c, naming the field. Zero values
// are valid (they select the defaults). Errors never contain secrets.
func (c Config) Validate() error {
	if c.URL == "" && len(c.Routes) == 0 {
		return errors.New("outbox: http: url: required when routes is empty")
	}
	if c.URL != "" {
		if err := c.checkURL(c.URL); err != nil {
			return fmt.Errorf("outbox: http: url: %w", err)
		}
	}
	for i, r := range c.Routes {
		if r.Topic == "" {
			return fmt.Errorf("outbox: http: routes[%d].topic: required", i)
		}
		if strings.ContainsAny(r.Topic, `[]\`) {
			return fmt.Errorf("outbox: http: routes[%d].topic: invalid pattern %q: %w", i, redact.URL(r.Topic), errReserved)
		}
		if r.URL == "" {
			return fmt.Errorf("outbox: http: routes[%d].url: required", i)
		}
		if err := c.checkURL(r.URL); err != nil {
			return fmt.Errorf("outbox: http: routes[%d].url: %w", i, err)
		}
	}
	if c.ContentType != "" && !validHeaderValue(c.ContentType) {
		return errors.New("outbox: http: content_type: contains control characters")
	}
	for i, s := range c.Secrets {
		if _, err := decodeSecret(string(s)); err != nil {
			return fmt.Errorf("outbox: http: secrets[%d]: %w", i, err)
		}
	}
	if err := sinkconf.CheckDurations("http", sinkconf.Dur("timeout", c.Timeout), sinkconf.Dur("dial_timeout", c.DialTimeout),
		sinkconf.Dur("tls_handshake_timeout", c.TLSHandshakeTimeout), sinkconf.Dur("response_header_timeout", c.ResponseHeaderTimeout),
		sinkconf.Dur("max_retry_after", c.MaxRetryAfter)); err != nil {
		return err
	}
	if c.RateLimit < 0 || math.IsNaN(c.RateLimit) || math.IsInf(c.RateLimit, 0) {
		return fmt.Errorf("outbox: http: rate_limit: must be a number of requests a second, 0 (none) or more, got %v", c.RateLimit)
	}
	if c.RateBurst < 0 || c.RateBurst > 0 && c.RateLimit == 0 {
		return fmt.Errorf("outbox: http: rate_burst: must be at least 1, and only with rate_limit, got %d", c.RateBurst)
	}
	if c.MaxConcurrency < 0 {
		return fmt.Errorf("outbox: http: max_concurrency: must not be negative, got %d", c.MaxConcurrency)
	}
	for i, code := range c.RetryStatuses {
		if code < 400 || code > 599 {
			return fmt.Errorf("outbox: http: retry_statuses[%d]: %d is not a 4xx or 5xx status", i, code)
		}
	}
	return nil
}

// checkURL validates one destination URL. The error never repeats the URL
// because its path, query or userinfo may hold a credential.
func (c Config) checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https, got %q", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("host is missing")
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return errors.New("must not contain a fragment (it is never sent)")
	}
	if u.Scheme == "http" && !c.AllowInsecureHTTP && !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("http:// to %s is refused (payloads and signatures would cross the network in clear text); use https:// or set allow_insecure_http", redact.URL(u.Hostname()))
	}
	if c.BlockPrivateNetworks {
		// Catch the obvious case when the config is loaded; names are
		// checked after resolution, at dial time.
		if ip, err := netip.ParseAddr(u.Hostname()); err == nil && blockedAddr(ip) {
			return fmt.Errorf("%s is a non-public address and block_private_networks is set", ip)
		}
	}
	return nil
}

func isLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Redacted returns c as its default URL and settings (name=value, wherever
// they were set), safe to log, followed by its routes: secrets show as
// "xxxxx" and URLs are reduced to scheme and host,
// because webhook URLs often carry a token in their path, query or
// userinfo.
func (c Config) Redacted() string {
	var b strings.Builder
	if c.URL != "" {
		b.WriteString(redactURL(c.URL))
	} else {
		b.WriteString("(no default url)")
	}
	// The settings follow the URL as settings, not as its query string:
	// they may come from the config file (secrets belong there), and
	// "…?secret=xxxxx" would say the secret sits in the URL.
	if q := params.Query(&c).Encode(); q != "" {
		b.WriteString(" " + strings.ReplaceAll(q, "&", " "))
	}
	for i, r := range c.Routes {
		fmt.Fprintf(&b, " routes[%d]=%q->%s", i, redact.URL(r.Topic), redactURL(r.URL))
	}
	return b.String()
}

// Target is the identity of c's destination (see sinks.Targeter): the
// default URL whole (its path and its own query, but neither userinfo nor
// a parameter named like a credential), each route's topic pattern and
// URL, and the content type, with the defaults applied; not the signing
// secrets, the timeouts, the concurrency or the rate limit. Unlike
// Redacted it keeps the path, which may hold the webhook's token: a
// target is only compared, through a hash.
func (c Config) Target() string {
	c = c.withDefaults()
	var b strings.Builder
	b.WriteString(params.Target(&c, c.URL))
	for _, r := range c.Routes {
		fmt.Fprintf(&b, " %q->%s", r.Topic, sinkconf.TargetURL(r.URL))
	}
	return b.String()
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// String returns Redacted, so printing a Config with %v never leaks a
// secret.
func (c Config) String() string { return c.Redacted() }

// GoString returns Redacted, for %#v.
func (c Config) GoString() string { return c.Redacted() }

// LogValue implements slog.LogValuer so that slog handlers (the JSON one
// would otherwise marshal every field) log the redacted form.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.Redacted()) }

// redactURL reduces raw to scheme://host[:port]; everything after the host
// is replaced by "/…" so that tokens in the path, query or userinfo never
// reach logs or errors. What is left still goes through redact.URL, which
// decides what a credential looks like for every sink.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "<invalid url>"
	}
	s := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		s += "/…"
	}
	return redact.URL(s)
}

// params are the --sink URL's query parameters, the Config yaml keys
// ("secret" may repeat); Redacted shows them back.
var params = sinkconf.NewParams("http", " (a webhook URL with its own query string belongs in the config file)",
	sinkconf.Secrets("secret", func(c *Config) *[]sinkconf.Secret { return &c.Secrets }),
	sinkconf.Routing(sinkconf.String("content_type", func(c *Config) *string { return &c.ContentType })),
	sinkconf.Duration("timeout", func(c *Config) *time.Duration { return &c.Timeout }),
	sinkconf.Duration("dial_timeout", func(c *Config) *time.Duration { return &c.DialTimeout }),
	sinkconf.Duration("tls_handshake_timeout", func(c *Config) *time.Duration { return &c.TLSHandshakeTimeout }),
	sinkconf.Duration("response_header_timeout", func(c *Config) *time.Duration { return &c.ResponseHeaderTimeout }),
	sinkconf.Duration("max_retry_after", func(c *Config) *time.Duration { return &c.MaxRetryAfter }),
	sinkconf.Int("max_concurrency", func(c *Config) *int { return &c.MaxConcurrency }),
	sinkconf.Float("rate_limit", func(c *Config) *float64 { return &c.RateLimit }),
	sinkconf.Int("rate_burst", func(c *Config) *int { return &c.RateBurst }),
	sinkconf.Func("retry_statuses", setRetryStatuses, retryStatusesString),
	sinkconf.Bool("retry_4xx", func(c *Config) *bool { return &c.Retry4xx }),
	sinkconf.Bool("allow_insecure_http", func(c *Config) *bool { return &c.AllowInsecureHTTP }),
	sinkconf.Bool("block_private_networks", func(c *Config) *bool { return &c.BlockPrivateNetworks }),
)

func setRetryStatuses(c *Config, v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not a status code", redact.URL(f))
		}
		c.RetryStatuses = append(c.RetryStatuses, n)
	}
	return nil
}

func retryStatusesString(c *Config) string {
	codes := make([]string, len(c.RetryStatuses))
	for i, n := range c.RetryStatuses {
		codes[i] = strconv.Itoa(n)
	}
	return strings.Join(codes, ",")
}

// ParseURL parses the --sink URL: an http:// or https:// webhook URL whose
// query parameters are sink options (the names of the Config yaml keys;
// "secret" may repeat, "retry_statuses" is a comma-separated list). Any
// other parameter is an error naming it. Because the query holds options,
// a webhook URL that needs its own query string is set in the config
// file's url, which may add it to the sink URL (see Refines). The
// returned Config is not yet validated.
func ParseURL(raw string) (Config, error) {
	var c Config
	u, err := url.Parse(raw)
	if err != nil {
		return c, errors.New("outbox: http: --sink: not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return c, fmt.Errorf("outbox: http: --sink: scheme must be http or https, got %q", u.Scheme)
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return c, errors.New("outbox: http: --sink: must not contain a fragment")
	}
	if err := params.Parse(&c, u.RawQuery); err != nil {
		return c, err
	}
	u.RawQuery = ""
	u.ForceQuery = false
	c.URL = u.String()
	return c, nil
}

// Refines implements sinks.Refiner: the config file's url may be the
// sink URL plus the receiver's own query string (?token=...), which the
// sink URL cannot carry because its query holds the sink's options.
func (c Config) Refines(key, fromURL, fromFile string) bool {
	if key != "url" {
		return false
	}
	u, err := url.Parse(fromFile)
	if err != nil || u.RawQuery == "" {
		return false
	}
	u.RawQuery = ""
	u.ForceQuery = false
	return u.String() == fromURL
}

// hostKey identifies the connection pool a URL uses: the concurrency limit
// is per scheme, host and port.
func hostKey(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}
