package builtin_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/builtin"
)

const secret = "s3cr3tPW"

// fullURLs set every parameter of every scheme to a value that shows in
// Redacted (non-zero, true), with secret wherever the sink takes one.
var fullURLs = map[string]string{
	"stdout":  "stdout://",
	"discard": "discard://",
	"kafka": "kafka://relay:" + secret + "@h1:9092,h2:9093?client_id=me&topic_prefix=prod.&topic_map=orders:o.v1&balancer=crc32" +
		"&max_message_bytes=2000000&write_timeout=3s&dial_timeout=1s&metadata_ttl=2s&allow_auto_topic_creation=true&idempotent=true" +
		"&tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_server_name=k&tls_insecure_skip_verify=true&sasl_mechanism=scram-sha-256",
	// aws-msk-iam takes no password: the second kafka URL sets its region.
	"kafka+iam": "kafka://b1:9098?tls=true&sasl_mechanism=aws-msk-iam&sasl_aws_region=eu-west-1",
	"amqp": "amqp://relay:" + secret + "@rabbit:5672/vh?exchange=events&routing_key={topic}&unroutable=retry&content_type=text/plain" +
		"&declare_exchange=passive&connection_name=r1&publish_timeout=5s&dial_timeout=2s&heartbeat=3s&reconnect_initial=1s" +
		"&reconnect_max=10s&channels=4&max_message_size=1024",
	"amqps": "amqps://relay:" + secret + "@rabbit:5671/vh?exchange=events&routing_key={topic}&unroutable=retry&content_type=text/plain" +
		"&declare_exchange=passive&connection_name=r1&publish_timeout=5s&dial_timeout=2s&heartbeat=3s&reconnect_initial=1s" +
		"&reconnect_max=10s&channels=4&max_message_size=1024" +
		"&tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_server_name=rabbit&tls_insecure_skip_verify=true",
	"http": "http://user:" + secret + "@127.0.0.1:9000/" + secret + "?secret=whsec_" + secret + "MfKQ9r8GKYqrTwjUPD8ILPZIo2La" +
		"&content_type=text/plain&timeout=5s&dial_timeout=1s&tls_handshake_timeout=2s&response_header_timeout=3s" +
		"&max_retry_after=1m&max_concurrency=8&rate_limit=12.5&rate_burst=4&retry_statuses=404,409&retry_4xx=true&allow_insecure_http=true&block_private_networks=false",
	"nats": "nats://relay:" + secret + "@n1:4222,n2:4222?subject=ev.{topic}&stream=EV&create_stream=true&stream_subjects=ev.>" +
		"&duplicate_window=5m&token=" + secret + "&name=r1&publish_timeout=5s&dial_timeout=1s" +
		"&reconnect_initial=1s&reconnect_max=10s&ordering=pipelined&max_pending=100&tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem" +
		"&tls_server_name=n&tls_insecure_skip_verify=true",
	// One credential at a time: the second nats URL sets the others.
	"nats+nkey":  "nats://n1:4222?nkey_seed_file=/s.nk",
	"nats+creds": "nats://n1:4222?creds_file=/c.creds",
	"redis": "redis://relay:" + secret + "@r:6379/1?stream=ev:{topic}&maxlen=1000&header_prefix=h-&client_name=r1" +
		"&publish_timeout=5s&dial_timeout=1s",
	"redis+cluster": "redis://relay:" + secret + "@r1:7000,r2:7001?cluster=true&max_age=24h",
	"rediss": "rediss://relay:" + secret + "@r:6380/0?tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem" +
		"&tls_server_name=r&tls_insecure_skip_verify=true",
	"sqs": "sqs://?queue_url=https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}&region=eu-west-1" +
		"&endpoint=http://127.0.0.1:4100&protocol=query&access_key_id=AKIA&secret_access_key=" + secret +
		"&body_encoding=base64&max_message_bytes=1048576&concurrency=4&publish_timeout=5s",
	"sns": "sns://?topic_arn=arn:aws:sns:eu-west-1:123456789012:{topic}&region=eu-west-1" +
		"&endpoint=http://127.0.0.1:4100&access_key_id=AKIA&secret_access_key=" + secret +
		"&body_encoding=base64&max_message_bytes=200000&concurrency=4&publish_timeout=5s",
	"kinesis": "kinesis://?stream=events-{topic}&record_format=raw&drop_headers=true&region=eu-west-1" +
		"&endpoint=http://127.0.0.1:4567&access_key_id=AKIA&secret_access_key=" + secret + "&concurrency=4&publish_timeout=5s",
	"pubsub": "pubsub://my-project?topic=events.{topic}&endpoint=us-east1-pubsub.googleapis.com:443" +
		"&credentials_file=/sa.json&publish_timeout=5s",
	"mqtt": "mqtt://relay:" + secret + "@m1:1883,m2:1884?topic=ev/{topic}&client_id=r1&keepalive=20s&session_expiry=1h" +
		"&publish_timeout=5s&connect_timeout=2s&reconnect_initial=1s&reconnect_max=10s",
	"mqtt+fields": "mqtt://m1?username=relay&password=" + secret,
	"mqtts": "mqtts://m1:8883?tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_server_name=m" +
		"&tls_insecure_skip_verify=true",
	"pubsub+insecure": "pubsub://my-project?endpoint=127.0.0.1:8085&insecure=true&reconnect_initial=50ms&reconnect_max=2s",
	"https": "https://user:" + secret + "@hooks.example.com/" + secret + "?secret=whsec_" + secret + "MfKQ9r8GKYqrTwjUPD8ILPZIo2La" +
		"&content_type=text/plain&timeout=5s&dial_timeout=1s&tls_handshake_timeout=2s&response_header_timeout=3s" +
		"&max_retry_after=1m&max_concurrency=8&rate_limit=12.5&rate_burst=4&retry_statuses=404,409&retry_4xx=true&allow_insecure_http=true&block_private_networks=true",
}

// TestDrivers checks that every registered driver describes itself and
// round-trips: URLs that together set every parameter parse, and their
// redacted forms show every parameter but no secret.
func TestDrivers(t *testing.T) {
	t.Parallel()
	for _, d := range builtin.Registry.Drivers() {
		t.Run(d.Label, func(t *testing.T) {
			t.Parallel()
			require.NotEmpty(t, d.Label)
			covered := map[string]bool{}
			for _, scheme := range d.Schemes {
				_, ok := fullURLs[scheme]
				require.True(t, ok, "add a URL that sets the parameters of %q to fullURLs", scheme)
			}
			for name, raw := range fullURLs {
				scheme, _, _ := strings.Cut(name, "+") // "nats+creds": a second URL for nats
				if !slices.Contains(d.Schemes, scheme) {
					continue
				}
				u, err := url.Parse(raw)
				require.NoError(t, err)
				cfg, err := d.Parse(raw, nil)
				require.NoError(t, err, scheme)
				red := cfg.Redacted()
				require.NotContains(t, red, secret, scheme)
				require.True(t, strings.HasPrefix(red, scheme+"://"), red)
				for p, v := range u.Query() {
					require.Contains(t, d.Params, p, "driver does not list its parameter %q", p)
					covered[p] = true
					if v[0] != "false" {
						require.Contains(t, red, p+"=", "Redacted does not show %q", p)
					}
				}
			}
			for _, p := range d.Params {
				require.True(t, covered[p], "no URL in fullURLs sets %q", p)
			}
		})
	}
}

// TestDescriptions pins what programs read from the drivers instead of
// switching on schemes.
func TestDescriptions(t *testing.T) {
	t.Parallel()
	for scheme, want := range map[string][4]string{ // section, label, system, binding
		"stdout":  {"", "stdout", "", ""},
		"discard": {"", "discard", "", ""},
		"kafka":   {"kafka", "kafka", "kafka", "kafka"},
		"amqp":    {"amqp", "amqp", "rabbitmq", "amqp"},
		"AMQPS":   {"amqp", "amqp", "rabbitmq", "amqp"},
		"http":    {"http", "http", "webhook", "http"},
		"https":   {"http", "http", "webhook", "http"},
		"nats":    {"nats", "nats", "nats", "nats"},
		"redis":   {"redis", "redis", "redis", ""},
		"rediss":  {"redis", "redis", "redis", ""},
		"sqs":     {"sqs", "sqs", "aws_sqs", ""},
		"sns":     {"sns", "sns", "aws_sns", ""},
		"kinesis": {"kinesis", "kinesis", "aws_kinesis", ""},
		"pubsub":  {"pubsub", "pubsub", "gcp_pubsub", ""},
		"mqtt":    {"mqtt", "mqtt", "mqtt", ""},
		"mqtts":   {"mqtt", "mqtt", "mqtt", ""},
	} {
		d, ok := builtin.Registry.Lookup(scheme)
		require.True(t, ok, scheme)
		require.Equal(t, want, [4]string{d.Section, d.Label, d.System, d.Binding}, scheme)
	}
	for _, scheme := range []string{"coap", ""} {
		_, ok := builtin.Registry.Lookup(scheme)
		require.False(t, ok, scheme)
	}
	require.Equal(t, []string{"kafka", "amqp", "http", "nats", "redis", "sqs", "sns", "kinesis", "pubsub", "mqtt"}, builtin.Registry.Sections())
}

func TestRegistryRefusesClashes(t *testing.T) {
	t.Parallel()
	d := sinks.Driver{Schemes: []string{"x"}, Label: "x", Parse: func(string, sinks.Decoder) (sinks.Config, error) { return nil, nil }}
	require.Panics(t, func() { sinks.NewRegistry(d, d) })
	require.Panics(t, func() { sinks.NewRegistry(sinks.Driver{Schemes: []string{"y"}}) })
}
