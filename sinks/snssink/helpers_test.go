package snssink

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/schemas"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEnv is a goaws server, a name prefix of its own, a sink publishing
// through a proxy (so that a test can cut the sink's connections), and
// clients straight to the server that create topics and read the SQS
// queues subscribed to them.
type testEnv struct {
	t      testing.TB
	srv    *throwaway.GoAWS
	sns    *sns.Client
	sqs    *sqs.Client
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

// direct publishes straight to the server: a stopped server then refuses
// the sink's connections, where the proxy would accept and drop them.
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

// setup builds an env on srv. The sink's topic ARN template is the topic
// named {header:x-test-route}{topic}: a message with that header set goes
// elsewhere (the conformance suite's poison, to a topic that does not
// exist).
func setup(tb testing.TB, srv *throwaway.GoAWS, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, srv: srv, prefix: testkit.RandName("t")}
	e.cfg = Config{
		TopicARN:        srv.TopicARN("{header:x-test-route}{topic}"),
		Region:          "us-east-1",
		AccessKeyID:     "test",
		SecretAccessKey: "test",
		PublishTimeout:  10 * time.Second,
	}
	for _, o := range opts {
		o(e)
	}
	ac, err := awsconfig.LoadDefaultConfig(context.Background(), awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	require.NoError(tb, err)
	e.sns = sns.NewFromConfig(ac, func(o *sns.Options) { o.BaseEndpoint = aws.String(srv.Endpoint()) })
	e.sqs = sqs.NewFromConfig(ac, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(srv.Endpoint())
		o.Protocol = awsquery.New(schemas.AmazonSQS) // goaws knows only the query protocol
	})
	e.cfg.Endpoint = srv.Endpoint()
	if !e.direct {
		e.proxy = tcpproxy.New(tb, srv.Addr())
		e.cfg.Endpoint = "http://" + e.proxy.Addr()
	}
	s, err := New(e.cfg, slog.New(slog.NewTextHandler(testkit.LogWriter(tb), &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(tb, err)
	e.sink = s
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(tb, s.Close(ctx))
	})
	return e
}

// topic creates an SNS topic named after the env's prefix and suffix and
// an SQS queue of the same name subscribed to it with raw message
// delivery (the body and attributes as published); it returns the topic
// name.
func (e *testEnv) topic(suffix string) string {
	e.t.Helper()
	ctx := context.Background()
	name := e.prefix + "-" + suffix
	_, err := e.sns.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name)})
	require.NoError(e.t, err)
	_, err = e.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(e.t, err)
	_, err = e.sns.Subscribe(ctx, &sns.SubscribeInput{TopicArn: aws.String(e.srv.TopicARN(name)), Protocol: aws.String("sqs"),
		Endpoint: aws.String(e.srv.QueueURL(name)), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	require.NoError(e.t, err)
	return name
}

// receiveOnce receives at most n messages of the queue subscribed to
// topic without waiting, and deletes them (throwaway.GoAWS.Take).
func (e *testEnv) receiveOnce(topic string, n int) ([]types.Message, error) {
	return e.srv.Take(e.sqs, e.srv.QueueURL(topic), n)
}

// receive reads n messages of the queue subscribed to topic, or fails when
// ctx ends first.
func (e *testEnv) receive(ctx context.Context, topic string, n int) ([]types.Message, error) {
	var out []types.Message
	for len(out) < n {
		ms, err := e.receiveOnce(topic, n-len(out))
		if err != nil {
			return out, err
		}
		out = append(out, ms...)
		if len(ms) == 0 {
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("receive %d of %d: %w", len(out), n, ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return out, nil
}

// delivered turns a received message back into what was published.
func delivered(topic string, m types.Message, b64 bool) sinktest.Delivered {
	d := sinktest.Delivered{Topic: topic, Headers: map[string]string{}, Partition: -1}
	body := aws.ToString(m.Body)
	d.Payload = []byte(body)
	if b64 {
		d.Payload, _ = base64.StdEncoding.DecodeString(body)
	}
	for k, v := range m.MessageAttributes {
		s := aws.ToString(v.StringValue)
		switch k {
		case AttrID:
			d.ID = s
		case AttrKey:
			d.Key = s
		case AttrSeq:
			d.Seq, _ = strconv.ParseInt(s, 10, 64)
		default:
			d.Headers[k] = s
		}
	}
	return d
}

func msgs(topic string, n, keys, size int) []sinks.Message {
	out := make([]sinks.Message, n)
	for i := range out {
		key := ""
		if keys > 0 {
			key = fmt.Sprintf("k%d", i%keys)
		}
		payload := []byte(strings.Repeat("x", size))
		copy(payload, fmt.Sprintf("payload-%d-", i))
		out[i] = sinktest.Msg(topic, key, int64(i+1), payload)
	}
	return out
}
