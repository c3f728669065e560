package sinks_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// fakeConfig is a sink config with a required key, a nested section and
// a secret, as real sinks have.
type fakeConfig struct {
	URL      string          `yaml:"url"`
	Exchange string          `yaml:"exchange"`
	Channels int             `yaml:"channels"`
	Password sinkconf.Secret `yaml:"password"`
	TLS      sinkconf.TLS    `yaml:"tls"`
}

func (c fakeConfig) Validate() error {
	if c.Exchange == "" {
		return errors.New("outbox: fake: exchange: required")
	}
	return nil
}

func (c fakeConfig) Redacted() string { return c.URL }

// refiningConfig accepts a section url that adds a query to the URL's.
type refiningConfig struct {
	fakeConfig `yaml:",inline"`
}

func (refiningConfig) Refines(key, fromURL, fromFile string) bool {
	return key == "url" && strings.HasPrefix(fromFile, fromURL+"?")
}

// decodeFake reads what a fake:// URL says, without validating.
func decodeFake[C any](set func(*C, url.Values, string)) func(string) (C, error) {
	return func(raw string) (C, error) {
		var c C
		u, err := url.Parse(raw)
		if err != nil {
			return c, err
		}
		q := u.Query()
		u.RawQuery = ""
		set(&c, q, u.String())
		return c, nil
	}
}

func setFake(c *fakeConfig, q url.Values, base string) {
	c.URL = base
	c.Exchange = q.Get("exchange")
	c.Password = sinkconf.Secret(q.Get("password"))
	c.TLS.CAFile = q.Get("tls_ca_file")
}

func openFake[C any](C, sinks.Env) (*memory.Sink, error) { return memory.New(), nil }

func section(t *testing.T, text string) sinks.Decoder {
	t.Helper()
	return func(dst any) error { return yaml.Unmarshal([]byte(text), dst) }
}

// Typed validates the URL and the section together, lays the URL over
// the section key by key (nested sections too), and refuses a key the two
// set differently, naming it, without showing a secret.
func TestTypedValidatesURLAndSectionTogether(t *testing.T) {
	t.Parallel()
	parse := sinks.Typed(decodeFake(setFake), openFake[fakeConfig])
	var cfg fakeConfig
	capture := sinks.Typed(decodeFake(setFake), func(c fakeConfig, _ sinks.Env) (*memory.Sink, error) {
		cfg = c
		return memory.New(), nil
	})

	_, err := parse("fake://h/", nil)
	require.ErrorContains(t, err, "exchange: required", "the URL alone lacks the exchange")

	c, err := capture("fake://h/?tls_ca_file=/a.pem", section(t, "exchange: e\nchannels: 3\ntls: {cert_file: /c.pem}\n"))
	require.NoError(t, err, "the section completes the URL")
	_, err = c.Open(sinks.Env{})
	require.NoError(t, err)
	require.Equal(t, fakeConfig{URL: "fake://h/", Exchange: "e", Channels: 3,
		TLS: sinkconf.TLS{CAFile: "/a.pem", CertFile: "/c.pem"}}, cfg, "keys of both, nested ones too")

	_, err = parse("fake://h/?exchange=e", section(t, "url: fake://h/\nexchange: e\n"))
	require.NoError(t, err, "the same value in both")

	for _, tc := range []struct {
		raw, section, key, values string
	}{
		{"fake://h/?exchange=a", "exchange: b\n", "exchange", ` (sink URL "a", section "b")`},
		{"fake://h/?exchange=e&tls_ca_file=/a.pem", "tls: {ca_file: /b.pem}\n", "tls.ca_file", ` (sink URL "/a.pem", section "/b.pem")`},
		{"fake://u:pw1@h/?exchange=e", "url: fake://u:pw2@h/\n", "url", " (the values are not shown: they may hold a secret)"},
		{"fake://h/?exchange=e&password=pw1", "password: pw2\n", "password", " (the values are not shown: they may hold a secret)"},
	} {
		_, err := parse(tc.raw, section(t, tc.section))
		var conflict *sinks.ConflictError
		require.ErrorAs(t, err, &conflict, "%s + %s", tc.raw, tc.section)
		require.Equal(t, tc.key, conflict.Key)
		require.Equal(t, "fake", conflict.Scheme)
		require.Equal(t, tc.values, conflict.Values())
		require.NotContains(t, err.Error(), "pw1")
		require.NotContains(t, err.Error(), "pw2")
	}

	refining := sinks.Typed(decodeFake(func(c *refiningConfig, q url.Values, base string) { setFake(&c.fakeConfig, q, base) }),
		openFake[refiningConfig])
	_, err = refining("fake://h/x?exchange=e", section(t, "url: fake://h/x?token=abc\n"))
	require.NoError(t, err, "a Refiner keeps the section's refinement")
	_, err = refining("fake://h/x?exchange=e", section(t, "url: fake://h/y?token=abc\n"))
	var conflict *sinks.ConflictError
	require.ErrorAs(t, err, &conflict, "and nothing else")
}
