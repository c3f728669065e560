package amqpsink

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks/internal/testcert"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("amqps://user:p%40ss@rabbit.example:5671/prod?exchange=events&routing_key=orders.{header:region}.{topic}" +
		"&unroutable=retry&content_type=application/json&declare_exchange=passive&connection_name=relay-1" +
		"&publish_timeout=5s&dial_timeout=2s&heartbeat=3s&reconnect_initial=100ms&reconnect_max=10s&channels=4" +
		"&max_message_size=1024&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_server_name=rabbit&tls_insecure_skip_verify=false")
	require.NoError(t, err)
	require.Equal(t, Config{
		URL:              "amqps://user:p%40ss@rabbit.example:5671/prod",
		Exchange:         "events",
		RoutingKey:       "orders.{header:region}.{topic}",
		Unroutable:       UnroutableRetry,
		ContentType:      "application/json",
		DeclareExchange:  DeclarePassive,
		ConnectionName:   "relay-1",
		PublishTimeout:   5 * time.Second,
		DialTimeout:      2 * time.Second,
		Heartbeat:        3 * time.Second,
		ReconnectInitial: 100 * time.Millisecond,
		ReconnectMax:     10 * time.Second,
		Channels:         4,
		MaxMessageSize:   1024,
		TLS:              TLSConfig{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem", ServerName: "rabbit"},
	}, c)

	c, err = ParseURL("amqp://guest:guest@127.0.0.1:5672/?exchange=amq.default")
	require.NoError(t, err)
	require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", c.URL)
	require.Equal(t, DefaultExchangeName, c.Exchange)
}

func TestParseURLErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"amqp://h/?exchange=x&bogus=1", `unknown sink URL parameter "bogus"`},
		{"amqp://h/?exchange=x&heartbeat=1", `sink URL parameter "heartbeat": "1" is not a duration`},
		{"amqp://h/?exchange=x&channels=many", `sink URL parameter "channels": "many" is not an integer`},
		{"amqp://h/?exchange=x&exchange=y", `sink URL parameter "exchange" given 2 times`},
		{"amqp://h/", "exchange: required"},
		{"http://h/?exchange=x", "url: scheme must be amqp or amqps"},
		{"amqp:///?exchange=x", "url: host is missing"},
		{"amqp://h/?exchange=x&unroutable=drop", "unroutable: must be"},
		{"amqp://h/?exchange=x&routing_key={nope}", "routing_key: unknown placeholder {nope}"},
		{"amqp://h/?exchange=x&routing_key=a}", `routing_key: unmatched "}"`},
		{"amqp://h/?exchange=x&routing_key={topic", `routing_key: unmatched "{"`},
		{"amqp://h/?exchange=x&declare_exchange=create", "declare_exchange: must be"},
		{"amqp://h/?exchange=x&tls_ca_file=/ca.pem", "tls: set, but the url scheme is amqp"},
		{"amqps://h/?exchange=x&tls_cert_file=/c.pem", "tls.cert_file: cert_file and key_file must be set together"},
		{"amqp://h/?exchange=x&reconnect_initial=2s&reconnect_max=1s", "reconnect_max"},
		{"amqp://h/?exchange=x&publish_timeout=-1s", "publish_timeout: must not be negative"},
		{"amqp://h/?exchange=x&channels=-1", "channels: must be between"},
		{"amqp://h:99999/?exchange=x", "url:"},
		{"amqp://u:se%ZZcret@h/?exchange=x", "not a valid URL"},
	} {
		_, err := ParseURL(tc.url)
		require.Error(t, err, tc.url)
		require.ErrorContains(t, err, tc.want, tc.url)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: amqp: "), err.Error())
		require.NotContains(t, err.Error(), "cret", "password leaked")
	}
}

func TestValidateConfig(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, Config{}.Validate(), "url: required")
	require.ErrorContains(t, Config{URL: "amqp://h/?heartbeat=1", Exchange: "x"}.Validate(), "url: must not have a query string")
	require.NoError(t, Config{URL: "amqp://h/", Exchange: "x"}.Validate())
	c := Config{URL: "amqp://h/", Exchange: "x"}.withDefaults()
	require.Equal(t, DefaultRoutingKey, c.RoutingKey)
	require.Equal(t, UnroutablePermanent, c.Unroutable)
	require.Zero(t, c.PublishTimeout, "unset: the caller's deadline bounds a Send (sinks.SendContext)")
	require.Equal(t, DefaultReconnectMax, c.ReconnectMax)
	require.NoError(t, c.Validate())
}

func TestConfigYAML(t *testing.T) {
	t.Parallel()
	var c Config
	require.NoError(t, yaml.Unmarshal([]byte(`
url: amqps://relay:secret@rabbit:5671/
exchange: events
publish_timeout: 15s
reconnect_max: 1m
tls:
  ca_file: /etc/ca.pem
`), &c))
	require.Equal(t, 15*time.Second, c.PublishTimeout)
	require.Equal(t, time.Minute, c.ReconnectMax)
	require.Equal(t, "/etc/ca.pem", c.TLS.CAFile)
	require.NoError(t, c.Validate())
}

func TestRedacted(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("amqp://relay:s3cr3t@rabbit:5672/vh?exchange=events")
	require.NoError(t, err)
	r := c.Redacted()
	require.NotContains(t, r, "s3cr3t")
	require.Contains(t, r, "relay:xxxxx@rabbit:5672/vh")
	require.Contains(t, r, "exchange=events")
}

func TestTemplate(t *testing.T) {
	t.Parallel()
	h := map[string]string{"region": "eu"}
	for _, tc := range []struct{ tmpl, want string }{
		{"{topic}", "orders"},
		{"x.{topic}.{key}", "x.orders.k1"},
		{"{header:region}.{topic}", "eu.orders"},
		{"{header:missing}{topic}", "orders"},
		{"static", "static"},
	} {
		tp, err := sinkconf.ParseTemplate(tc.tmpl)
		require.NoError(t, err, tc.tmpl)
		require.Equal(t, tc.want, tp.Render("orders", "k1", h), tc.tmpl)
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("amqp://guest:guest@127.0.0.1:5672/?exchange=events")
	f.Add("amqps://u:p@h:5671/v?exchange=e&routing_key={header:a}.{topic}&tls_ca_file=/x")
	f.Add("amqp://h/?exchange=x&routing_key={")
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseURL(raw)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "outbox: amqp: "), err.Error())
			return
		}
		require.NoError(t, c.Validate())
		_ = c.Redacted()
	})
}

func TestTLSConfigFiles(t *testing.T) {
	t.Parallel()
	pair := testcert.New(t)
	certFile, keyFile := pair.CertFile, pair.KeyFile

	c := Config{URL: "amqps://h:5671/", Exchange: "x", TLS: TLSConfig{CAFile: certFile, CertFile: certFile, KeyFile: keyFile}}
	tc, err := c.tlsConfig()
	require.NoError(t, err)
	require.NotNil(t, tc.RootCAs)
	require.Len(t, tc.Certificates, 1)
	require.Equal(t, "h", tc.ServerName)
	require.Equal(t, uint16(0x0303), tc.MinVersion)

	c.TLS.CAFile = keyFile
	_, err = c.tlsConfig()
	require.ErrorContains(t, err, "tls.ca_file: no PEM certificate")
	_, err = New(c, nil)
	require.ErrorContains(t, err, "tls.ca_file")
}
