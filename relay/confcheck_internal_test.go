package relay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// The fingerprint covers where and how a route's messages go, and
// nothing else: tuning may differ between relays of one route.
func TestFingerprintCoversTheRouteNotTheTuning(t *testing.T) {
	t.Parallel()
	sink := memory.New()
	base := Config{Route: "orders", Topics: []string{"orders.*"}, Destination: "https://h/x?secret=xxxxx"}.WithDefaults()
	hash, summary := fingerprint(base, sink)
	require.Regexp(t, `^2:[0-9a-f]{16}$`, hash)
	require.Equal(t, "sink https://h/x?secret=xxxxx, topics orders.*, on-dead-letter skip", summary)

	secret := base
	secret.Destination = "https://h/x?secret=the-real-one"
	h0, sum0 := fingerprint(secret, sink)
	require.Equal(t, hash, h0, "the fingerprint covers the target, not its credentials")
	require.NotContains(t, sum0, "the-real-one")

	tuned := base
	tuned.Workers, tuned.BatchSize, tuned.MaxAttempts, tuned.ID = 7, 3, 2, "other"
	h, _ := fingerprint(tuned, memory.New())
	require.Equal(t, hash, h, "tuning and the relay's id are not part of it")

	ce, err := format.Parse(format.NameCloudEvents, format.Options{Binding: format.BindingHTTP})
	require.NoError(t, err)
	for name, change := range map[string]func(c *Config) sinks.Sink{
		"destination":    func(c *Config) sinks.Sink { c.Destination = "stdout"; return sink },
		"topics":         func(c *Config) sinks.Sink { c.Topics = []string{"orders.*", "payments"}; return sink },
		"exclude topics": func(c *Config) sinks.Sink { c.ExcludeTopics = []string{"orders.internal"}; return sink },
		"on-dead-letter": func(c *Config) sinks.Sink { c.OnDeadLetter = OnDeadLetterHold; return sink },
		"route":          func(c *Config) sinks.Sink { c.Route = "orders2"; return sink },
		"fan-out": func(c *Config) sinks.Sink {
			c.fanOut = []fanOutDest{{Route: "audit", Topics: []string{"*"}}}
			return sink
		},
		"format": func(c *Config) sinks.Sink { return format.Wrap(sink, ce) },
	} {
		c := base
		s := change(&c)
		h, sum := fingerprint(c, s)
		require.NotEqual(t, hash, h, name)
		if name != "route" { // status shows the route beside the summary
			require.NotEqual(t, summary, sum, name)
		}
	}
}

// webhook opens the HTTP sink of raw (it connects to nothing until a
// Send) and returns a relay configuration of it as the CLI makes one.
func webhook(t *testing.T, raw string) (Config, sinks.Sink) {
	t.Helper()
	c, err := httpsink.ParseURL(raw)
	require.NoError(t, err)
	s, err := httpsink.New(c, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	return Config{Route: "orders", Destination: c.Redacted()}.WithDefaults(), s
}

// Red team, finding 5: two webhooks on one host that differ only in their
// path read alike in the sink's redacted description, yet deliver to
// different receivers: their fingerprints differ, and their summaries
// too. Tuning the sink (its timeout, its concurrency) or rotating its
// signing secret changes neither the hash nor the target's digest.
func TestFingerprintCoversTheWebhookPathNotItsTuning(t *testing.T) {
	t.Parallel()
	a, sa := webhook(t, "http://127.0.0.1:9000/a")
	b, sb := webhook(t, "http://127.0.0.1:9000/b")
	require.Equal(t, a.Destination, b.Destination, "the redacted URLs hide the paths")
	ha, suma := fingerprint(a, sa)
	hb, sumb := fingerprint(b, sb)
	require.NotEqual(t, ha, hb)
	require.NotEqual(t, suma, sumb, "the summaries tell them apart by the target's digest")
	require.Regexp(t, `^sink http://127\.0\.0\.1:9000/… \(target [0-9a-f]{8}\), topics \*, on-dead-letter skip$`, suma)
	require.NotContains(t, suma, "/a")

	for _, raw := range []string{
		"http://127.0.0.1:9000/a?timeout=5s",
		"http://127.0.0.1:9000/a?max_concurrency=3&rate_limit=10&dial_timeout=1s&response_header_timeout=2s",
		"http://127.0.0.1:9000/a?secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaMfKQ9r8GKYqrTwjUPD8ILPZIo2La",
	} {
		c, s := webhook(t, raw)
		h, sum := fingerprint(c, s)
		require.Equal(t, ha, h, raw)
		require.Equal(t, digest(suma), digest(sum), raw)
		require.NotContains(t, sum, "MfKQ9r8GKYqrTwjUPD8ILPZIo2La", raw)
	}
}

// digest returns the target's digest a summary shows.
func digest(summary string) string {
	_, after, _ := strings.Cut(summary, "(target ")
	d, _, _ := strings.Cut(after, ")")
	return d
}
