package relay

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// The fingerprint covers where and how a route's messages go, and
// nothing else: tuning may differ between relays of one route.
func TestFingerprintCoversTheRouteNotTheTuning(t *testing.T) {
	t.Parallel()
	sink := memory.New()
	base := Config{Route: "orders", Topics: []string{"orders.*"}, Destination: "https://h/x?secret=xxxxx"}.WithDefaults()
	hash, summary := fingerprint(base, sink)
	require.Regexp(t, `^1:[0-9a-f]{16}$`, hash)
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
