package httpsink

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("https://user:pw@example.com:8443/hook/path?timeout=5s&dial_timeout=1s&tls_handshake_timeout=2s" +
		"&response_header_timeout=3s&max_retry_after=1m&max_concurrency=8&retry_statuses=404,%20409&retry_4xx=true" +
		"&allow_insecure_http=false&block_private_networks=1&content_type=application%2Fjson" +
		"&secret=" + secretA + "&secret=" + secretB)
	require.NoError(t, err)
	require.Equal(t, Config{
		URL:                   "https://user:pw@example.com:8443/hook/path",
		ContentType:           "application/json",
		Secrets:               []sinkconf.Secret{secretA, secretB},
		Timeout:               5 * time.Second,
		DialTimeout:           time.Second,
		TLSHandshakeTimeout:   2 * time.Second,
		ResponseHeaderTimeout: 3 * time.Second,
		MaxRetryAfter:         time.Minute,
		MaxConcurrency:        8,
		RetryStatuses:         []int{404, 409},
		Retry4xx:              true,
		BlockPrivateNetworks:  true,
	}, c)
	require.NoError(t, c.Validate())

	c, err = ParseURL("http://127.0.0.1:9000/hook")
	require.NoError(t, err)
	require.Equal(t, Config{URL: "http://127.0.0.1:9000/hook"}, c)

	c, err = ParseURL("https://example.com/hook?")
	require.NoError(t, err)
	require.Equal(t, "https://example.com/hook", c.URL)

	for _, tc := range []struct{ in, err string }{
		{"https://example.com/?token=abc", `unknown sink URL parameter "token"`},
		{"https://example.com/?timeout=5s&Timeout=1s", `unknown sink URL parameter "Timeout"`},
		{"https://example.com/?timeout=5s&timeout=6s", `"timeout" given 2 times`},
		{"https://example.com/?timeout=5", `"timeout": "5" is not a duration`},
		{"https://example.com/?max_concurrency=x", `"max_concurrency": "x" is not an integer`},
		{"https://example.com/?retry_statuses=404,x", `"retry_statuses": "x" is not a status code`},
		{"https://example.com/?retry_4xx=maybe", `"retry_4xx": "maybe" is not true or false`},
		{"https://example.com/?a=%zz", "malformed query string"},
		{"https://example.com/#frag", "fragment"},
		{"kafka://example.com/", `scheme must be http or https, got "kafka"`},
		{"://nope", "not a valid URL"},
	} {
		_, err := ParseURL(tc.in)
		require.ErrorContains(t, err, tc.err, tc.in)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: http: "), err.Error())
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"https://example.com/hook",
		"http://127.0.0.1:1/?timeout=1s&secret=" + secretA,
		"https://u:p@h/p?retry_statuses=404,409&max_concurrency=3",
		"https://h/?x=1", "https://h/#f", "http://[::1]:80/?retry_4xx=true",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseURL(raw)
		if err != nil {
			return
		}
		// Whatever parsed must carry no options in the URL and must either
		// validate or fail with a field-naming error, never panic.
		require.NotContains(t, c.URL, "?timeout=")
		if err := c.Validate(); err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "outbox: http: "), err.Error())
		}
		_ = c.Redacted()
	})
}

func TestConfigYAML(t *testing.T) {
	t.Parallel()
	const doc = `
url: https://default.example.com/hook
routes:
  - topic: "orders.*"
    url: https://orders.example.com/hook?token=abc
secrets: [` + secretA + `, ` + secretB + `]
content_type: application/json
timeout: 15s
dial_timeout: 2s
tls_handshake_timeout: 3s
response_header_timeout: 10s
max_retry_after: 5m
max_concurrency: 32
retry_statuses: [404]
retry_4xx: false
allow_insecure_http: false
block_private_networks: true
`
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&c))
	require.NoError(t, c.Validate())
	require.Equal(t, []Route{{Topic: "orders.*", URL: "https://orders.example.com/hook?token=abc"}}, c.Routes)
	require.Equal(t, 15*time.Second, c.Timeout)
	require.Equal(t, 5*time.Minute, c.MaxRetryAfter)
	require.Equal(t, 32, c.MaxConcurrency)
	require.Equal(t, []int{404}, c.RetryStatuses)
	require.True(t, c.BlockPrivateNetworks)
	require.Len(t, c.Secrets, 2)
}

// Webhook routes read topic patterns as relay routes do (package topic),
// not as path.Match did.
func TestRoutePatternsAreTopicPatterns(t *testing.T) {
	t.Parallel()
	c := Config{URL: "https://fallback.example/", Routes: []Route{
		{Topic: "orders.*", URL: "https://orders.example/"},
		{Topic: "a/?", URL: "https://a.example/"},
	}}
	require.NoError(t, c.Validate())
	s, err := New(c, nil)
	require.NoError(t, err)
	defer s.Close(t.Context())
	for topic, want := range map[string]string{
		"orders.eu.placed": "https://orders.example/", // '*' crosses dots
		"a/b":              "https://a.example/",
		"a/bc":             "https://fallback.example/",
		"orders":           "https://fallback.example/",
	} {
		require.Equal(t, want, s.targetFor(topic).raw, topic)
	}
	for _, p := range []string{"[ab]", "a]", `a\*`} {
		c := Config{Routes: []Route{{Topic: p, URL: "https://a.example/"}}}
		require.ErrorContains(t, c.Validate(), "routes[0].topic: invalid pattern", p)
	}
}
