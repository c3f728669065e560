package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	kinesistypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/mqtttest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/builtin"
)

// docExample is a config file that a page of docs/sinks shows: a YAML
// block with a top-level sink key.
type docExample struct {
	page string // "amqp.md"
	line int    // of the block's first line
	text string
	sink string // the example's sink URL
}

// local reports whether the example runs against a server on this
// machine (at the port its tool listens on by default), rather than
// naming a production host to show a form.
func (e docExample) local() bool { return strings.Contains(e.text, "127.0.0.1") }

// sinkDocExamples reads every config-file example of docs/sinks.
func sinkDocExamples(t *testing.T) []docExample {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "..", "..", "docs", "sinks", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	var out []docExample
	for _, page := range pages {
		f, err := os.Open(page)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		var block []string
		in, start, n := false, 0, 0
		for sc.Scan() {
			n++
			line := sc.Text()
			switch {
			case !in && strings.TrimSpace(line) == "```yaml":
				in, start, block = true, n+1, nil
			case in && strings.TrimSpace(line) == "```":
				in = false
				text := strings.Join(block, "\n") + "\n"
				var top map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(text), &top), "%s line %d", page, start)
				if s, ok := top["sink"].(string); ok {
					out = append(out, docExample{page: filepath.Base(page), line: start, text: text, sink: s})
				}
			case in:
				block = append(block, line)
			}
		}
		require.NoError(t, sc.Err())
		require.NoError(t, f.Close())
	}
	return out
}

// docFixture is a sink's server for a local example, and how to read
// back what the relay delivered to it.
type docFixture struct {
	// replace maps the addresses the examples use (each tool's default
	// port) to this test's server.
	replace map[string]string
	// received returns the payloads that arrived so far.
	received func(ctx context.Context) ([]string, error)
}

// docFixtures start, for a sink label, the server of its page's local
// examples; the destinations the examples name are created for topic,
// the outbox topic the test writes.
var docFixtures = map[string]func(t *testing.T, topic string) docFixture{
	"kafka":   kafkaFixture,
	"amqp":    amqpFixture,
	"http":    httpFixture,
	"nats":    natsFixture,
	"redis":   redisFixture,
	"sqs":     sqsFixture,
	"sns":     snsFixture,
	"kinesis": kinesisFixture,
	"pubsub":  pubsubFixture,
	"mqtt":    mqttFixture,
}

// TestDocumentedSinkConfigFiles runs every config file that docs/sinks
// shows. A local example (one for each sink that has a config-file
// section) starts a relay from the file as written, with only the
// servers' addresses changed to this test's, and delivers: the messages
// arrive where the file's section says. An example that names a
// production host parses and validates (the relay stops only at the
// database URL, the first thing checked after the sink).
func TestDocumentedSinkConfigFiles(t *testing.T) {
	examples := sinkDocExamples(t)
	covered := map[string]bool{}
	for _, ex := range examples {
		d, ok := builtin.Registry.Lookup(sinks.Scheme(ex.sink))
		require.True(t, ok, "%s line %d: sink %q", ex.page, ex.line, ex.sink)
		if ex.local() {
			covered[d.Label] = true
		}
	}
	for _, d := range builtin.Registry.Drivers() {
		if d.Section != "" {
			require.True(t, covered[d.Label], "docs/sinks has no local config-file example of the %s sink", d.Label)
		}
	}

	for _, ex := range examples {
		d, _ := builtin.Registry.Lookup(sinks.Scheme(ex.sink))
		t.Run(fmt.Sprintf("%s:%d", strings.TrimSuffix(ex.page, ".md"), ex.line), func(t *testing.T) {
			dir := t.TempDir()
			if !ex.local() {
				f := filepath.Join(dir, "relay.yaml")
				require.NoError(t, os.WriteFile(f, []byte(ex.text), 0o600))
				code, _, stderr := run(t, "run", "--config", f, "--database-url", "postgres://x@127.0.0.1:1/d?sslmode=bogus")
				require.Equal(t, 2, code, stderr)
				require.Contains(t, stderr, "database-url: cannot parse", "the sink's configuration passed every check")
				return
			}
			pool, schema, w := e2e(t)
			topic := "docs_" + strings.ReplaceAll(schema, "_", "")
			fx := docFixtures[d.Label](t, topic)
			text := ex.text
			for from, to := range fx.replace {
				text = strings.ReplaceAll(text, from, to)
			}
			f := filepath.Join(dir, "relay.yaml")
			require.NoError(t, os.WriteFile(f, []byte(text), 0o600))
			t.Logf("%s line %d, as run:\n%s", ex.page, ex.line, text)

			const n = 12
			want := map[string]bool{}
			var msgs []outbox.Message
			for i := range n {
				p := fmt.Sprintf("%s:%d", topic, i)
				want[p] = true
				msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%3), Payload: []byte(p),
					Headers: map[string]string{"type": "OrderPlaced"}})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, w.Write(ctx, tx, msgs...))
			require.NoError(t, tx.Commit(ctx))

			code, _, stderr := run(t, "run", "--config", f, "--exit-when-empty")
			require.Equal(t, 0, code, stderr)
			require.Empty(t, deadLetters(t, pool, schema), "nothing dead-lettered")
			var got []string
			testkit.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
				got, err = fx.received(ctx)
				if err != nil {
					return false, err.Error()
				}
				missing := 0
				for p := range want {
					if !slices.Contains(got, p) {
						missing++
					}
				}
				return missing == 0, fmt.Sprintf("%d of %d messages not arrived; got %q", missing, n, got)
			})
		})
	}
}

// TestSinkURLAndSectionMustAgree: a key set in both the sink URL and its
// section to different values stops the relay with exit 2, naming the
// key, its line, both values and where the URL came from; set to the same
// value, or in one place, it is accepted.
func TestSinkURLAndSectionMustAgree(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	unsetenv(t, "OUTBOX_SINK")
	// sslmode=bogus: a config that passes every sink check fails on the
	// database URL, before any connection.
	db := "postgres://x@127.0.0.1:1/d?sslmode=bogus"
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml string
		args       []string
		want       []string
	}{
		{"amqp exchange", "sink: amqp://guest:guest@127.0.0.1:5672/?exchange=A\namqp:\n  routing_key: r\n  exchange: B\n", nil,
			[]string{"line 4", "amqp.exchange", `sink URL "A", section "B"`, "(sink at line 1)", "set it in one place"}},
		{"amqp url", "sink: amqp://guest:guest@127.0.0.1:5672/\namqp:\n  url: amqp://guest:guest@127.0.0.1:5673/\n  exchange: x\n", nil,
			[]string{"line 3", "amqp.url", `sink URL "amqp://127.0.0.1:5672/…", section "amqp://127.0.0.1:5673/…"`}},
		{"sqs queue_url, URL from the command line", "sqs:\n  region: us-east-1\n  queue_url: http://127.0.0.1:4100/1/b\n",
			[]string{"--sink", "sqs://?queue_url=http://127.0.0.1:4100/1/a"},
			[]string{"line 3", "sqs.queue_url", "(--sink)"}},
		{"nested tls key in a route", "routes:\n  - name: a\n    topics: [x]\n    sink: amqps://h:5671/?exchange=e&tls_ca_file=/a.pem\n    amqp:\n      tls:\n        ca_file: /b.pem\n", nil,
			[]string{"line 7", "routes[0].amqp.tls.ca_file", `sink URL "/a.pem", section "/b.pem"`, "(routes[0].sink at line 4)"}},
		{"a secret is not shown", "sink: kafka://u:pw1@127.0.0.1:9092\nkafka:\n  sasl:\n    password: pw2\n", nil,
			[]string{"line 4", "kafka.sasl.password", "values are not shown"}},
		{"webhook url, another path", "sink: http://127.0.0.1:9/a\nhttp:\n  url: http://127.0.0.1:9/b?token=abc\n", nil,
			[]string{"line 3", "http.url", "values are not shown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, "c.yaml")
			require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
			code, _, stderr := run(t, append([]string{"run", "--config", f, "--database-url", db}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
			require.NotContains(t, stderr, "guest:guest")
			require.NotContains(t, stderr, "pw1")
			require.NotContains(t, stderr, "pw2")
			require.NotContains(t, stderr, "token=abc")
		})
	}

	for _, tc := range []struct{ name, yaml string }{
		{"the same value in both", "sink: amqp://guest:guest@127.0.0.1:5672/?exchange=A\namqp:\n  url: amqp://guest:guest@127.0.0.1:5672/\n  exchange: A\n"},
		{"a required key from the section", "sink: amqp://guest:guest@127.0.0.1:5672/\namqp:\n  exchange: A\n"},
		{"sqs queue_url from the section", "sink: sqs://\nsqs:\n  region: us-east-1\n  queue_url: http://127.0.0.1:4100/1/a\n"},
		{"tls keys from both places", "sink: amqps://h:5671/?exchange=e&tls_ca_file=/a.pem\namqp:\n  tls:\n    cert_file: /c.pem\n    key_file: /k.pem\n"},
		{"sasl credentials in the section, mechanism in the URL", "sink: kafka://127.0.0.1:9092?tls=true&sasl_mechanism=plain\nkafka:\n  sasl:\n    username: u\n    password: p\n"},
		{"sasl mechanism in the section, credentials in the URL", "sink: kafka://u:p@127.0.0.1:9092\nkafka:\n  sasl:\n    mechanism: scram-sha-256\n"},
		{"webhook url with its own query", "sink: http://127.0.0.1:9/a\nhttp:\n  url: http://127.0.0.1:9/a?token=abc\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, "ok.yaml")
			require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
			code, _, stderr := run(t, "run", "--config", f, "--database-url", db)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, "database-url: cannot parse", "the sink's configuration passed every check")
		})
	}
}

// ---- fixtures --------------------------------------------------------------

// collector keeps payloads that a push consumer receives.
type collector struct {
	mu  sync.Mutex
	got []string
}

func (c *collector) add(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, p)
}

func (c *collector) received(context.Context) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got), nil
}

func kafkaFixture(t *testing.T, topic string) docFixture {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	broker := cluster.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	var got []string
	return docFixture{
		replace: map[string]string{"127.0.0.1:9092": broker},
		received: func(ctx context.Context) ([]string, error) {
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
			return got, nil
		},
	}
}

// amqpFixture binds a queue of its own to the exchange events of the
// shared broker, for the routing key the example renders for topic.
func amqpFixture(t *testing.T, topic string) docFixture {
	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		pgtest.Unavailable(t, "rabbitmq at %s: %v", testkit.AMQPURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare("events", "topic", false, true, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "orders."+topic, "events", false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	c := &collector{}
	go func() {
		for d := range deliveries {
			c.add(string(d.Body))
		}
	}()
	return docFixture{
		replace:  map[string]string{"amqp://guest:guest@127.0.0.1:5672/": strings.TrimSuffix(testkit.AMQPURL(), "/") + "/"},
		received: c.received,
	}
}

// httpFixture is a receiver that keeps what arrives at /hook with the
// query string of the example's url and a signature.
func httpFixture(t *testing.T, _ string) docFixture {
	c := &collector{}
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		if r.URL.Path == "/hook" && r.URL.Query().Get("token") == "abc" && r.Header.Get("webhook-signature") != "" {
			c.add(string(r.Body))
		}
		return http.StatusOK, ""
	})
	return docFixture{replace: map[string]string{"127.0.0.1:8080": srv.Addr()}, received: c.received}
}

// natsFixture reads the subject the example renders for topic from the
// stream EVENTS of the shared server, and purges it afterwards.
func natsFixture(t *testing.T, topic string) docFixture {
	nc, err := nats.Connect(testkit.NATSURL(), nats.Timeout(2*time.Second))
	if err != nil {
		pgtest.Unavailable(t, "nats at %s: %v", testkit.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	subject := "events." + topic
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if s, err := js.Stream(ctx, "EVENTS"); err == nil {
			_ = s.Purge(ctx, jetstream.WithPurgeSubject(subject))
		}
	})
	return docFixture{
		replace: map[string]string{"nats://127.0.0.1:4222": testkit.NATSURL()},
		received: func(ctx context.Context) ([]string, error) {
			s, err := js.Stream(ctx, "EVENTS")
			if err != nil {
				return nil, err
			}
			cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
			if err != nil {
				return nil, err
			}
			batch, err := cons.FetchNoWait(1000)
			if err != nil {
				return nil, err
			}
			var got []string
			for m := range batch.Messages() {
				got = append(got, string(m.Data()))
			}
			return got, batch.Error()
		},
	}
}

// redisFixture reads the stream the example renders for topic from the
// shared server, and deletes it afterwards.
func redisFixture(t *testing.T, topic string) docFixture {
	opts, err := redis.ParseURL(testkit.RedisURL())
	require.NoError(t, err)
	opts.DisableIdentity = true
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		pgtest.Unavailable(t, "redis at %s: %v", testkit.RedisURL(), err)
	}
	key := "events:" + topic
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	return docFixture{
		replace: map[string]string{"redis://127.0.0.1:6379/0": testkit.RedisURL()},
		received: func(ctx context.Context) ([]string, error) {
			entries, err := rdb.XRange(ctx, key, "-", "+").Result()
			var got []string
			for _, e := range entries {
				p, _ := e.Values["payload"].(string)
				got = append(got, p)
			}
			return got, err
		},
	}
}

// goawsAction runs a goaws action as the pages' "Try it locally" does
// (a GET with the action's parameters).
func goawsAction(t *testing.T, srv *throwaway.GoAWS, params url.Values) {
	t.Helper()
	res, err := http.Get(srv.Endpoint() + "/?" + params.Encode())
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode, "%v: %s", params, body)
}

func takeAll(srv *throwaway.GoAWS, queue string) func(context.Context) ([]string, error) {
	var got []string
	return func(context.Context) ([]string, error) {
		ms, err := srv.TakeAll(queue)
		for _, m := range ms {
			got = append(got, m.Body)
		}
		return got, err
	}
}

// sqsFixture is a goaws with the queue named topic (the example's queue
// URL template renders {topic}).
func sqsFixture(t *testing.T, topic string) docFixture {
	srv := throwaway.StartGoAWS(t)
	goawsAction(t, srv, url.Values{"Action": {"CreateQueue"}, "QueueName": {topic}})
	return docFixture{replace: map[string]string{"http://127.0.0.1:4100": srv.Endpoint()}, received: takeAll(srv, topic)}
}

// snsFixture is a goaws with the topic named topic and a queue subscribed
// to it with raw message delivery.
func snsFixture(t *testing.T, topic string) docFixture {
	srv := throwaway.StartGoAWS(t)
	queue := topic + "-copy"
	goawsAction(t, srv, url.Values{"Action": {"CreateTopic"}, "Name": {topic}})
	goawsAction(t, srv, url.Values{"Action": {"CreateQueue"}, "QueueName": {queue}})
	goawsAction(t, srv, url.Values{"Action": {"Subscribe"}, "TopicArn": {srv.TopicARN(topic)}, "Protocol": {"sqs"},
		"Endpoint": {srv.QueueURL(queue)}, "Attributes.entry.1.key": {"RawMessageDelivery"}, "Attributes.entry.1.value": {"true"}})
	return docFixture{replace: map[string]string{"http://127.0.0.1:4100": srv.Endpoint()}, received: takeAll(srv, queue)}
}

// kinesisFixture is a kinesalite with the stream named topic; records are
// the JSON envelope (the example's record_format).
func kinesisFixture(t *testing.T, topic string) docFixture {
	srv := throwaway.Kinesalite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	require.NoError(t, err)
	client := kinesis.NewFromConfig(ac, func(o *kinesis.Options) { o.BaseEndpoint = aws.String(srv.URL()) })
	_, err = client.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(topic), ShardCount: aws.Int32(1)})
	require.NoError(t, err)
	testkit.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		out, err := client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(topic)})
		if err != nil {
			return false, err.Error()
		}
		return out.StreamDescriptionSummary.StreamStatus == kinesistypes.StreamStatusActive, string(out.StreamDescriptionSummary.StreamStatus)
	})
	return docFixture{
		replace: map[string]string{"http://127.0.0.1:4567": srv.URL()},
		received: func(ctx context.Context) ([]string, error) {
			it, err := client.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(topic),
				ShardId: aws.String("shardId-000000000000"), ShardIteratorType: kinesistypes.ShardIteratorTypeTrimHorizon})
			if err != nil {
				return nil, err
			}
			out, err := client.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it.ShardIterator})
			if err != nil {
				return nil, err
			}
			var got []string
			for _, r := range out.Records {
				var env struct{ Payload []byte }
				if err := json.Unmarshal(r.Data, &env); err != nil {
					return nil, fmt.Errorf("record %q: %w", r.Data, err)
				}
				got = append(got, string(env.Payload))
			}
			return got, nil
		},
	}
}

// pubsubFixture is an in-process Pub/Sub fake with the topic named topic
// in the example's project, local.
func pubsubFixture(t *testing.T, topic string) docFixture {
	srv := pstest.NewServerWithAddress("127.0.0.1:0")
	t.Cleanup(func() { _ = srv.Close() })
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/local/topics/" + topic})
	require.NoError(t, err)
	return docFixture{
		replace: map[string]string{"127.0.0.1:8085": srv.Addr},
		received: func(context.Context) ([]string, error) {
			var got []string
			for _, m := range srv.Messages() {
				got = append(got, string(m.Data))
			}
			return got, nil
		},
	}
}

// mqttFixture is a throwaway Mosquitto with a subscriber to the topic the
// example renders for topic.
func mqttFixture(t *testing.T, topic string) docFixture {
	srv := throwaway.Mosquitto(t)
	sub := mqtttest.Subscribe(t, srv.URL(), "events/"+topic, mqtttest.Options{KeepAlive: 30})
	return docFixture{
		replace: map[string]string{"127.0.0.1:1883": srv.Addr()},
		received: func(context.Context) ([]string, error) {
			var got []string
			for _, p := range sub.All() {
				got = append(got, string(p.Payload))
			}
			return got, nil
		},
	}
}
