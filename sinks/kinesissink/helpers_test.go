package kinesissink

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEnv is a kinesalite server, a stream name prefix of its own, a
// sink sending through a proxy (so that a test can cut the sink's
// connections) and a client straight to the server that creates and
// reads streams.
type testEnv struct {
	t      testing.TB
	srv    *throwaway.Server
	admin  *kinesis.Client
	prefix string
	proxy  *tcpproxy.Proxy
	sink   *Sink
	cfg    Config
	direct bool

	mu      sync.Mutex
	readers map[string]*streamReader
}

type envOpt func(*testEnv)

func withConfig(f func(*Config)) envOpt { return func(e *testEnv) { f(&e.cfg) } }

// direct sends straight to the server (benchmarks: the proxy would be a
// cost the raw client does not pay; outage tests: the server itself
// goes away).
func direct() envOpt { return func(e *testEnv) { e.direct = true } }

// setup builds an env on srv. The sink's stream template is
// {header:x-test-route}{topic}: a message with that header set goes
// elsewhere (the conformance suite's poison, to a stream that does not
// exist).
func setup(tb testing.TB, srv *throwaway.Server, opts ...envOpt) *testEnv {
	tb.Helper()
	e := &testEnv{t: tb, srv: srv, prefix: testkit.RandName("t"), readers: map[string]*streamReader{}}
	e.cfg = Config{
		Stream:          "{header:x-test-route}{topic}",
		Region:          "us-east-1",
		AccessKeyID:     "test",
		SecretAccessKey: "test",
		PublishTimeout:  10 * time.Second,
	}
	for _, o := range opts {
		o(e)
	}
	admin, err := newClient(context.Background(), Config{Region: "us-east-1", Endpoint: srv.URL(), AccessKeyID: "test", SecretAccessKey: "test"})
	require.NoError(tb, err)
	e.admin = admin
	e.cfg.Endpoint = srv.URL()
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

// stream creates an active stream of shards shards named after the env's
// prefix and suffix, and returns its name (the topic the sink sends to
// it).
func (e *testEnv) stream(suffix string, shards int32) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	createStream(e.t, e.admin, name, shards)
	return name
}

// createStream creates the stream and waits until it is active.
func createStream(tb testing.TB, client *kinesis.Client, name string, shards int32) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := client.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)})
	require.NoError(tb, err)
	testkit.Eventually(tb, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		out, err := client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
		if err != nil {
			return false, err.Error()
		}
		return out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive, string(out.StreamDescriptionSummary.StreamStatus)
	})
}

// record is one record read back, with the index of its shard.
type record struct {
	types.Record
	Shard int
}

// streamReader reads a stream's shards from their start, keeping each
// shard's iterator between reads.
type streamReader struct {
	client *kinesis.Client
	stream string
	shards []string
	iters  map[string]*string
}

func newReader(client *kinesis.Client, stream string) *streamReader {
	return &streamReader{client: client, stream: stream, iters: map[string]*string{}}
}

// next returns at most n records not read yet, shard by shard (each
// shard's in its order). Its requests are bounded by their own timeout,
// not the caller's: a read cut short after the server answered would
// lose its records.
func (r *streamReader) next(n int) ([]record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.shards == nil {
		out, err := r.client.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(r.stream)})
		if err != nil {
			return nil, fmt.Errorf("list shards: %w", err)
		}
		for _, s := range out.Shards {
			r.shards = append(r.shards, aws.ToString(s.ShardId))
		}
	}
	var got []record
	for _, shard := range r.shards {
		if len(got) >= n {
			break
		}
		it := r.iters[shard]
		if it == nil {
			out, err := r.client.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(r.stream),
				ShardId: aws.String(shard), ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
			if err != nil {
				return got, fmt.Errorf("shard iterator: %w", err)
			}
			it = out.ShardIterator
		}
		out, err := r.client.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it, Limit: aws.Int32(int32(min(n-len(got), 10000)))})
		if err != nil {
			return got, fmt.Errorf("get records: %w", err)
		}
		r.iters[shard] = out.NextShardIterator
		idx, _ := strconv.Atoi(strings.TrimPrefix(shard, "shardId-"))
		for _, rec := range out.Records {
			got = append(got, record{Record: rec, Shard: idx})
		}
	}
	return got, nil
}

// read returns the next n records of the stream, or fails when ctx ends
// first.
func (e *testEnv) read(ctx context.Context, stream string, n int) ([]record, error) {
	e.mu.Lock()
	r := e.readers[stream]
	if r == nil {
		r = newReader(e.admin, stream)
		e.readers[stream] = r
	}
	e.mu.Unlock()
	var out []record
	for len(out) < n {
		got, err := r.next(n - len(out))
		out = append(out, got...)
		if err != nil {
			return out, err
		}
		if len(got) == 0 {
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("read %d of %d: %w", len(out), n, ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return out, nil
}

// delivered turns a record of record_format=json back into what was
// sent.
func delivered(t testing.TB, r record) sinktest.Delivered {
	var env Envelope
	require.NoError(t, json.Unmarshal(r.Data, &env), "%s", r.Data)
	require.Equal(t, aws.ToString(r.PartitionKey), partitionKey(env.Key, env.ID))
	return sinktest.Delivered{ID: env.ID, Seq: env.Seq, Topic: env.Topic, Key: env.Key, Payload: env.Payload,
		Headers: env.Headers, Partition: r.Shard}
}

func partitionKey(key, id string) string {
	if key == "" {
		return id
	}
	return key
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
