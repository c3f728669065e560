package sqssink

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
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
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

// testEnv is a goaws server, a queue name prefix of its own, a sink
// sending through a proxy (so that a test can cut the sink's connections)
// and a client straight to the server that creates and reads queues.
type testEnv struct {
	t      testing.TB
	srv    *throwaway.GoAWS
	admin  *sqs.Client
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

// direct sends straight to the server (benchmarks: the proxy would be a
// cost the raw client does not pay).
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

// setup builds an env on srv. The sink's queue URL template is the
// queue named {header:x-test-route}{topic}: a message with that header
// set goes elsewhere (the conformance suite's poison, to a queue that
// does not exist).
func setup(tb testing.TB, srv *throwaway.GoAWS, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, srv: srv, prefix: testkit.RandName("t")}
	e.cfg = Config{
		QueueURL:        srv.QueueURL("{header:x-test-route}{topic}"),
		Region:          "us-east-1",
		Protocol:        "query", // goaws knows only the query protocol
		AccessKeyID:     "test",
		SecretAccessKey: "test",
		PublishTimeout:  10 * time.Second,
	}
	for _, o := range opts {
		o(e)
	}
	admin, err := newClient(context.Background(), Config{Region: "us-east-1", Endpoint: srv.Endpoint(), Protocol: "query",
		AccessKeyID: "test", SecretAccessKey: "test"})
	require.NoError(tb, err)
	e.admin = admin
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

// queue creates a queue named after the env's prefix and suffix (FIFO
// when fifo) and returns the topic that the sink sends to it.
func (e *testEnv) queue(suffix string, fifo bool) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	in := &sqs.CreateQueueInput{QueueName: aws.String(name)}
	if fifo {
		name += ".fifo"
		in.QueueName = aws.String(name)
		in.Attributes = map[string]string{"FifoQueue": "true"}
	}
	_, err := e.admin.CreateQueue(context.Background(), in)
	require.NoError(e.t, err)
	return name
}

// receive reads n messages of the queue of topic, deleting each, or
// fails when ctx ends first.
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

// receiveOnce receives at most n messages of the queue of topic without
// waiting, and deletes them (throwaway.GoAWS.Take).
func (e *testEnv) receiveOnce(topic string, n int) ([]types.Message, error) {
	return e.srv.Take(e.admin, e.srv.QueueURL(topic), n)
}

// delivered turns a received message back into what was sent.
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

func seqOf(m types.Message) int64 {
	n, _ := strconv.ParseInt(aws.ToString(m.MessageAttributes[AttrSeq].StringValue), 10, 64)
	return n
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
