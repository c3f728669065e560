package builtin_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
	"github.com/outbox-relay/outbox-relay/sinks/builtin"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
	"github.com/outbox-relay/outbox-relay/sinks/kinesissink"
	"github.com/outbox-relay/outbox-relay/sinks/mqttsink"
	"github.com/outbox-relay/outbox-relay/sinks/natssink"
	"github.com/outbox-relay/outbox-relay/sinks/pubsubsink"
	"github.com/outbox-relay/outbox-relay/sinks/redissink"
	"github.com/outbox-relay/outbox-relay/sinks/snssink"
	"github.com/outbox-relay/outbox-relay/sinks/sqssink"
)

// targetOf adapts a sink package's ParseURL to return the target.
func targetOf[C sinks.Targeter](parse func(string) (C, error)) func(string) (string, error) {
	return func(raw string) (string, error) {
		c, err := parse(raw)
		if err != nil {
			return "", err
		}
		return c.Target(), nil
	}
}

// targets are the sinks that name their target, by scheme.
var targets = map[string]func(string) (string, error){
	"kafka": targetOf(kafkasink.ParseURL), "amqp": targetOf(amqpsink.ParseURL), "amqps": targetOf(amqpsink.ParseURL),
	"http": targetOf(httpsink.ParseURL), "https": targetOf(httpsink.ParseURL), "nats": targetOf(natssink.ParseURL),
	"redis": targetOf(redissink.ParseURL), "rediss": targetOf(redissink.ParseURL), "sqs": targetOf(sqssink.ParseURL),
	"sns": targetOf(snssink.ParseURL), "kinesis": targetOf(kinesissink.ParseURL), "pubsub": targetOf(pubsubsink.ParseURL),
	"mqtt": targetOf(mqttsink.ParseURL), "mqtts": targetOf(mqttsink.ParseURL),
}

// routingParams are the parameters that decide where a message goes or
// the form it arrives in; every other one is tuning, a credential, the
// client's name, TLS or a safety check.
var routingParams = map[string][]string{
	"kafka":   {"topic_prefix", "topic_map", "balancer"},
	"amqp":    {"exchange", "routing_key", "content_type"},
	"http":    {"content_type"},
	"nats":    {"subject", "stream"},
	"redis":   {"stream", "header_prefix"},
	"sqs":     {"queue_url", "region", "endpoint", "body_encoding"},
	"sns":     {"topic_arn", "region", "endpoint", "body_encoding"},
	"kinesis": {"stream", "record_format", "drop_headers", "region", "endpoint"},
	"pubsub":  {"topic", "endpoint"},
	"mqtt":    {"topic"},
}

// The target of every sink leaves out what only tunes it or
// authenticates it: dropping any such parameter from a URL that sets
// them all leaves the target as it was, and no credential shows in it.
func TestTargetsLeaveOutTuningAndCredentials(t *testing.T) {
	t.Parallel()
	for name, raw := range fullURLs {
		scheme, _, _ := strings.Cut(name, "+")
		target, ok := targets[scheme]
		if !ok {
			continue // stdout, discard: the relay's Destination stands for them
		}
		want, err := target(raw)
		require.NoError(t, err, name)
		if scheme != "http" && scheme != "https" { // their path holds the secret on purpose
			require.NotContains(t, want, secret, name)
		}
		require.NotContains(t, want, "whsec_", name)
		u, err := url.Parse(raw)
		require.NoError(t, err)
		d, ok := builtin.Registry.Lookup(scheme)
		require.True(t, ok, scheme)
		for p := range u.Query() {
			if slices.Contains(routingParams[d.Label], p) {
				continue
			}
			q := u.Query()
			q.Del(p)
			v := *u
			v.RawQuery = q.Encode()
			got, err := target(v.String())
			if err != nil {
				t.Logf("%s without %s does not parse: %v", name, p, err)
				continue
			}
			require.Equal(t, want, got, "%s: %s changed the target", name, p)
		}
	}
}

// Two URLs that send messages elsewhere have different targets; two
// that differ only in tuning or credentials have the same.
func TestTargetsTellDestinationsApart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"http://h.localhost/a", "http://h.localhost/b", false},
		{"http://h.localhost/a", "http://h.localhost/a?timeout=5s&max_concurrency=3&dial_timeout=1s", true},
		{"http://h.localhost/a", "http://u:pw@H.localhost/a?secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaMfKQ9r8GKYqrTwjUPD8ILPZIo2La", true},
		{"http://h.localhost/a", "http://h.localhost/a?content_type=text/plain", false},
		{"http://h.localhost/", "http://h.localhost", true},
		{"http://h.localhost", "http://other.localhost", false},
		{"kafka://k:9092?topic_prefix=a.", "kafka://k:9092?topic_prefix=b.", false},
		{"kafka://k:9092?topic_map=o:x", "kafka://k:9092?topic_map=o:y", false},
		{"kafka://k:9092", "kafka://k:9092?balancer=crc32", false},
		{"kafka://k:9092", "kafka://k:9092?balancer=murmur2&write_timeout=1s&client_id=x", true},
		{"kafka://k:9092", "kafka://u:pw@k:9092", true},
		{"kafka://k1:9092", "kafka://k2:9092", false},
		{"amqp://h/?exchange=a", "amqp://h/?exchange=b", false},
		{"amqp://h/?exchange=a", "amqp://h/?exchange=a&routing_key=x", false},
		{"amqp://h/?exchange=a", "amqp://h?exchange=a&routing_key={topic}&channels=2&publish_timeout=1s", true},
		{"amqp://h/v1?exchange=a", "amqp://h/v2?exchange=a", false},
		{"amqp://u:p@h/?exchange=a", "amqp://v:q@h/?exchange=a", true},
		{"nats://n:4222?subject=a.{topic}", "nats://n:4222?subject=b.{topic}", false},
		{"nats://n:4222?stream=A", "nats://n:4222?stream=B", false},
		{"nats://n:4222", "nats://n:4222?max_pending=3&reconnect_max=5s&token=t", true},
		{"redis://r:6379/0?stream=a", "redis://r:6379/0?stream=b", false},
		{"redis://r:6379/0?stream=a", "redis://r:6379/1?stream=a", false},
		{"redis://r:6379/0?stream=a", "redis://r:6379/0?stream=a&dial_timeout=1s&publish_timeout=2s", true},
		{"sqs://?queue_url=https://q/a&region=eu-west-1", "sqs://?queue_url=https://q/b&region=eu-west-1", false},
		{"sqs://?queue_url=https://q/a&region=eu-west-1", "sqs://?queue_url=https://q/a&region=eu-west-1&concurrency=2", true},
		{"sns://?topic_arn=arn:aws:sns:eu-west-1:1:a", "sns://?topic_arn=arn:aws:sns:eu-west-1:1:b", false},
		{"kinesis://?stream=a&region=eu-west-1", "kinesis://?stream=b&region=eu-west-1", false},
		{"kinesis://?stream=a&region=eu-west-1", "kinesis://?stream=a&region=eu-west-1&record_format=json", false},
		{"pubsub://p?topic=a", "pubsub://p?topic=b", false},
		{"pubsub://p?topic=a", "pubsub://q?topic=a", false},
		{"mqtt://m:1883?topic=a/{topic}", "mqtt://m:1883?topic=b/{topic}", false},
		{"mqtt://m:1883?topic=a/{topic}", "mqtt://m:1883?topic=a/{topic}&keepalive=10s&client_id=x", true},
	} {
		scheme, _, _ := strings.Cut(c.a, ":")
		ta, err := targets[scheme](c.a)
		require.NoError(t, err, c.a)
		tb, err := targets[scheme](c.b)
		require.NoError(t, err, c.b)
		if c.same {
			require.Equal(t, ta, tb, "%s and %s", c.a, c.b)
		} else {
			require.NotEqual(t, ta, tb, "%s and %s", c.a, c.b)
		}
	}
}

// A webhook's routes (from the config file) are part of its target.
func TestWebhookRoutesArePartOfTheTarget(t *testing.T) {
	t.Parallel()
	base := httpsink.Config{URL: "https://h/a", Routes: []httpsink.Route{{Topic: "orders.*", URL: "https://h/orders"}}}
	other := base
	other.Routes = []httpsink.Route{{Topic: "orders.*", URL: "https://h/orders2"}}
	require.NotEqual(t, base.Target(), other.Target())
	tuned := base
	tuned.MaxConcurrency, tuned.RateLimit = 2, 5
	require.Equal(t, base.Target(), tuned.Target())
}
