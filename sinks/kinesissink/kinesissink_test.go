package kinesissink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// TestConformance runs the shared suite against kinesalite, with the JSON
// envelope (a raw record carries neither the id, the position nor the
// headers the suite checks) on streams of 3 shards, read back shard by
// shard with GetShardIterator and GetRecords: a key's order is its
// shard's.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := throwaway.Kinesalite(t)
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Partitions: true, Poison: true, Transient: true, Restart: true, Outage: true,
			MaxPayload: 700 << 10,
			Why: map[string]string{
				"MaxPayload": "a Kinesis record is at most 1 MiB, and the JSON envelope holds the payload in base64, a third larger",
			}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t, srv, withConfig(func(c *Config) { c.RecordFormat = FormatJSON }))
			var mu sync.Mutex
			var streams []string
			return &sinktest.Env{
				Sink: e.sink,
				Topic: func(suffix string) string {
					stream := e.stream(suffix, 3)
					mu.Lock()
					streams = append(streams, stream)
					mu.Unlock()
					return stream
				},
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					var out []sinktest.Delivered
					for len(out) < n {
						mu.Lock()
						ss := append([]string(nil), streams...)
						mu.Unlock()
						got := 0
						for _, stream := range ss {
							rctx, cancel := context.WithTimeout(ctx, time.Millisecond)
							rs, err := e.read(rctx, stream, n-len(out))
							cancel()
							if err != nil && !errors.Is(err, context.DeadlineExceeded) {
								return out, err
							}
							for _, r := range rs {
								out = append(out, delivered(t, r))
							}
							got += len(rs)
							if len(out) == n {
								break
							}
						}
						if got > 0 {
							continue
						}
						select {
						case <-ctx.Done():
							return out, fmt.Errorf("read %d of %d: %w", len(out), n, ctx.Err())
						case <-time.After(5 * time.Millisecond):
						}
					}
					return out, nil
				},
				Poison: func(topic string) sinks.Message {
					// To a stream that does not exist: Kinesis refuses it.
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": "missing-"}
					return m
				},
				BreakTransient: e.proxy.Break,
				Restart:        e.proxy.Restart,
				Down:           e.proxy.Down,
				Up:             e.proxy.Up,
			}
		},
	})
}

// TestRawRecords: with record_format=raw the data is the payload byte
// for byte and the partition key is the message key (keyless: the
// message id); a message with headers is dead-lettered unless
// drop_headers is set.
func TestRawRecords(t *testing.T) {
	t.Parallel()
	srv := throwaway.Kinesalite(t)
	e := setup(t, srv)
	ctx := context.Background()
	stream := e.stream("raw", 2)
	batch := msgs(stream, 6, 2, 10)
	batch[1].Key = ""
	batch[2].Payload = []byte{0, 0xff, 0xfe, '\n'}
	batch[3].Payload = nil
	require.NoError(t, e.sink.Send(ctx, batch))
	got, err := e.read(ctx, stream, len(batch))
	require.NoError(t, err)
	byPK := map[string][][]byte{}
	for _, r := range got {
		byPK[aws.ToString(r.PartitionKey)] = append(byPK[aws.ToString(r.PartitionKey)], r.Data)
	}
	want := map[string][][]byte{}
	for _, m := range batch {
		p := m.Payload
		if p == nil {
			p = []byte{}
		}
		want[partitionKey(m.Key, m.ID)] = append(want[partitionKey(m.Key, m.ID)], p)
	}
	for pk, ps := range want {
		require.Len(t, byPK[pk], len(ps), pk)
		for i := range ps {
			require.True(t, bytes.Equal(ps[i], byPK[pk][i]), "partition key %s record %d: %q, want %q", pk, i, byPK[pk][i], ps[i])
		}
	}

	withHeaders := sinktest.Msg(stream, "k0", 10, []byte("h"))
	withHeaders.Headers = map[string]string{"type": "OrderPlaced"}
	err = e.sink.Send(ctx, []sinks.Message{withHeaders})
	require.True(t, sinks.IsPermanent(sinks.Outcome(err, 0, 1)), "%v", err)
	require.ErrorIs(t, sinks.Outcome(err, 0, 1), ErrInvalid)
	require.ErrorContains(t, err, "record_format=json")

	drop := setup(t, srv, withConfig(func(c *Config) { c.DropHeaders = true }))
	require.NoError(t, drop.sink.Send(ctx, []sinks.Message{withHeaders}))
	rs, err := e.read(ctx, stream, 1)
	require.NoError(t, err)
	require.Equal(t, "h", string(rs[0].Data))

	// The relay's own outbox-producer header is no application header: it
	// goes with the id and the position, refusing nothing.
	named := sinktest.Msg(stream, "k0", 11, []byte("p"))
	named.Headers = map[string]string{sinks.HeaderProducer: "orders/outbox"}
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{named}))
	rs, err = e.read(ctx, stream, 1)
	require.NoError(t, err)
	require.Equal(t, "p", string(rs[0].Data))
	named.Headers["type"] = "OrderPlaced"
	err = e.sink.Send(ctx, []sinks.Message{named})
	require.ErrorContains(t, err, "the message has 1 headers", "an application header beside it is refused, and counted alone")
}

// TestRefusedBeforeSending: what Kinesis would refuse for the record
// itself is dead-lettered with the reason, and stops only its key.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.Kinesalite(t))
	ctx := context.Background()
	stream := e.stream("refused", 1)
	cases := []struct {
		mod  func(m *sinks.Message)
		want string
	}{
		{func(m *sinks.Message) { m.Payload = bytes.Repeat([]byte("a"), MaxRecordBytes) }, "above Kinesis' limit"},
		{func(m *sinks.Message) { m.Key = strings.Repeat("é", MaxPartitionKey+1) }, "257 characters"},
		{func(m *sinks.Message) { m.Key = "k\xff" }, "not valid UTF-8"},
		{func(m *sinks.Message) { m.Headers = map[string]string{"x-test-route": "bad/"} }, "a name holds only"},
		{func(m *sinks.Message) { m.Headers = map[string]string{"x-test-route": "arn:aws:sqs:x:1:"} }, "not a Kinesis stream ARN"},
	}
	for _, c := range cases {
		bad := sinktest.Msg(stream, "k", 1, []byte("x"))
		c.mod(&bad)
		batch := []sinks.Message{bad, sinktest.Msg(stream, bad.Key, 2, []byte("after")), sinktest.Msg(stream, "other", 3, []byte("other"))}
		err := e.sink.Send(ctx, batch)
		be := &sinks.BatchError{}
		require.ErrorAs(t, err, &be, c.want)
		require.True(t, sinks.IsPermanent(be.Errs[0]), "%s: %v", c.want, be.Errs[0])
		require.ErrorIs(t, be.Errs[0], ErrInvalid)
		require.ErrorContains(t, be.Errs[0], c.want)
		require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted, c.want)
		require.NoError(t, be.Errs[2], c.want)
	}
	got, err := e.read(ctx, stream, len(cases))
	require.NoError(t, err)
	for _, r := range got {
		require.Equal(t, "other", string(r.Data))
	}
	// The largest record Kinesis takes goes.
	m := sinktest.Msg(stream, "k", 1, bytes.Repeat([]byte("a"), MaxRecordBytes-1))
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{m}))
}

// TestRequestsSplit: a batch wider than one request goes out as several
// (at most 500 records and 5 MiB each), never two messages of one key in
// one request, and arrives whole and in order per key.
func TestRequestsSplit(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.Kinesalite(t))
	var mu sync.Mutex
	var sizes []int
	var wrong []string
	p := e.sink.plan()
	send := p.Send
	p.Send = func(ctx context.Context, req []*awsbatch.Entry) []error {
		keys := map[string]bool{}
		n := 0
		mu.Lock()
		for _, en := range req {
			if keys[en.PartitionKey] {
				wrong = append(wrong, "two records of key "+en.PartitionKey+" in one request")
			}
			keys[en.PartitionKey] = true
			n += en.Size
		}
		if n > MaxRequestBytes {
			wrong = append(wrong, fmt.Sprintf("a request of %d bytes", n))
		}
		sizes = append(sizes, len(req))
		mu.Unlock()
		return send(ctx, req)
	}
	ctx := context.Background()
	stream := e.stream("split", 4)
	batch := append(msgs(stream, 1500, 700, 100), msgs(stream, 12, 12, 900<<10)...) // 700 keys; then 10 MiB of 12 keys
	for i := range batch {
		batch[i].Seq = int64(i + 1)
	}
	require.NoError(t, p.Run(ctx, batch, "test"))
	require.Empty(t, wrong)
	t.Logf("requests of %v records", sizes)
	require.Contains(t, sizes, MaxRecords)
	got, err := e.read(ctx, stream, len(batch))
	require.NoError(t, err)
	seq := map[string]int64{}
	for _, m := range batch {
		seq[string(m.Payload)] = m.Seq
	}
	last := map[string]int64{}
	seen := 0
	for _, r := range got {
		s, ok := seq[string(r.Data)]
		require.True(t, ok)
		k := aws.ToString(r.PartitionKey)
		require.Greater(t, s, last[k], "key %s in order", k)
		last[k] = s
		seen++
	}
	require.Equal(t, len(batch), seen)
}

// TestRecordFailureStopsItsKey: when Kinesis refuses one record of a
// request (a throttled shard), the key's later messages of the Send are
// not attempted (they never reach the stream, the relay sends them again
// after it) and the other keys are delivered. The refusal is injected in
// place of the record in a request otherwise sent to kinesalite.
func TestRecordFailureStopsItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.Kinesalite(t))
	ctx := context.Background()
	stream := e.stream("fail", 2)
	batch := msgs(stream, 30, 3, 10) // k0, k1, k2, k0, ...
	p := e.sink.plan()
	send := p.Send
	p.Send = func(ctx context.Context, req []*awsbatch.Entry) []error {
		var keep []*awsbatch.Entry
		for _, en := range req {
			if en.I != 3 { // k0's second message
				keep = append(keep, en)
			}
		}
		errs := send(ctx, keep)
		out := make([]error, 0, len(req))
		for _, en := range req {
			if en.I == 3 {
				out = append(out, answer(en.Dest, []types.PutRecordsResultEntry{{ErrorCode: aws.String("ProvisionedThroughputExceededException"),
					ErrorMessage: aws.String("Rate exceeded for shard shardId-000000000001")}}, 1)[0])
				continue
			}
			out = append(out, errs[0])
			errs = errs[1:]
		}
		return out
	}
	err := p.Run(ctx, batch, "test")
	be := &sinks.BatchError{}
	require.ErrorAs(t, err, &be)
	for i, m := range batch {
		switch {
		case i == 3:
			require.ErrorIs(t, be.Errs[i], ErrRefused)
			require.False(t, sinks.IsPermanent(be.Errs[i]))
			d, ok := sinks.RetryAfter(be.Errs[i])
			require.True(t, ok)
			require.Equal(t, ThrottleDelay, d)
		case m.Key == "k0" && i > 3:
			require.ErrorIs(t, be.Errs[i], sinks.ErrNotAttempted, "message %d", i)
		default:
			require.NoError(t, be.Errs[i], "message %d", i)
		}
	}
	got, err := e.read(ctx, stream, 30-9)
	require.NoError(t, err)
	for _, r := range got {
		if aws.ToString(r.PartitionKey) == "k0" {
			require.Equal(t, "payload-0-", string(r.Data), "only k0's first message reached the stream")
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	more, _ := e.read(rctx, stream, 1)
	require.Empty(t, more)
}

// TestStoppedIsNotAttempted: an endpoint that refuses connections costs
// no attempt; the sink delivers again once kinesalite is back on its
// port, with what it had stored.
func TestStoppedIsNotAttempted(t *testing.T) {
	t.Parallel()
	srv := throwaway.Kinesalite(t)
	e := setup(t, srv, withConfig(func(c *Config) { c.PublishTimeout = 2 * time.Second }), direct())
	ctx := context.Background()
	stream := e.stream("down", 1)
	first := msgs(stream, 1, 1, 1)
	require.NoError(t, e.sink.Send(ctx, first))
	srv.Kill()
	batch := msgs(stream, 3, 2, 1)
	var err error
	for range 3 { // a pooled connection cut under a Send is an attempt
		if err = e.sink.Send(ctx, batch); errors.Is(sinks.Outcome(err, 0, 3), sinks.ErrNotAttempted) {
			break
		}
	}
	for i := range batch {
		require.ErrorIs(t, sinks.Outcome(err, i, 3), sinks.ErrNotAttempted, "%v", err)
		require.False(t, sinks.IsPermanent(sinks.Outcome(err, i, 3)))
	}
	srv.Start()
	require.NoError(t, e.sink.Send(ctx, batch))
	got, err := e.read(ctx, stream, 4)
	require.NoError(t, err)
	require.Len(t, got, 4, "the record stored before the stop is still there")
}

// TestHealthy: a fixed stream is described, a template lists streams;
// both fail while the endpoint is down.
func TestHealthy(t *testing.T) {
	t.Parallel()
	srv := throwaway.Kinesalite(t)
	e := setup(t, srv, direct())
	ctx := context.Background()
	stream := e.stream("health", 1)
	require.NoError(t, e.sink.Healthy(ctx))
	fixed := setup(t, srv, withConfig(func(c *Config) { c.Stream = stream }), direct())
	require.NoError(t, fixed.sink.Healthy(ctx))
	missing := setup(t, srv, withConfig(func(c *Config) { c.Stream = stream + "-missing" }), direct())
	require.ErrorContains(t, missing.sink.Healthy(ctx), "ResourceNotFoundException")
	srv.Kill()
	require.Error(t, e.sink.Healthy(ctx))
	require.Error(t, fixed.sink.Healthy(ctx))
}

// TestErrorCodes: Kinesis' codes, for a record or a whole request,
// sorted into retriable (throttles with a delay) and permanent.
func TestErrorCodes(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]string{
		"ProvisionedThroughputExceededException": "throttle", "LimitExceededException": "throttle",
		"KMSThrottlingException": "throttle", "InternalFailure": "retry", "ServiceUnavailable": "retry",
		"KMSDisabledException": "retry", "KMSInvalidStateException": "retry", "KMSAccessDeniedException": "retry",
		"KMSNotFoundException": "retry", "KMSOptInRequired": "retry", "AccessDeniedException": "retry",
		"ResourceInUseException": "retry", "ExpiredTokenException": "retry",
		"ValidationException": "permanent", "InvalidArgumentException": "permanent", "ResourceNotFoundException": "permanent",
	} {
		for _, err := range []error{
			answer("s", []types.PutRecordsResultEntry{{ErrorCode: aws.String(code), ErrorMessage: aws.String("m")}}, 1)[0],
			requestErr("s", &smithy.GenericAPIError{Code: code, Message: "m"}),
		} {
			require.ErrorIs(t, err, ErrRefused, code)
			require.ErrorContains(t, err, code)
			_, delay := sinks.RetryAfter(err)
			got := "retry"
			if sinks.IsPermanent(err) {
				got = "permanent"
			} else if delay {
				got = "throttle"
			}
			require.Equal(t, want, got, code)
		}
	}
	errs := answer("s", []types.PutRecordsResultEntry{{SequenceNumber: aws.String("1"), ShardId: aws.String("shardId-0")}}, 2)
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[1], "answered 1 results for 2 records")
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("kinesis://?stream=events-{topic}&region=eu-west-1&access_key_id=AK&secret_access_key=s3cret&record_format=json")
	require.NoError(t, err)
	require.Equal(t, "events-{topic}", c.Stream)
	require.Equal(t, FormatJSON, c.RecordFormat)
	require.NotContains(t, c.Redacted(), "s3cret")
	require.Contains(t, c.Redacted(), "secret_access_key=xxxxx")
	c, err = ParseURL("kinesis://?region=eu-west-1")
	require.NoError(t, err)
	require.Equal(t, DefaultStream, c.withDefaults().Stream)
	require.Equal(t, FormatRaw, c.withDefaults().RecordFormat)
	for raw, want := range map[string]string{
		"kinesis://?bogus=1":                              `unknown sink URL parameter "bogus"`,
		"kinesis://host?stream=x":                         "want kinesis://?stream=",
		"kinesis://?stream={nope}":                        "stream: unknown placeholder",
		"kinesis://?record_format=avro":                   "record_format:",
		"kinesis://?record_format=json&drop_headers=true": "drop_headers:",
		"kinesis://?access_key_id=a":                      "set together",
		"kinesis://?endpoint=127.0.0.1:4567":              "endpoint:",
		"kinesis://?concurrency=-1":                       "concurrency:",
		"kinesis://?publish_timeout=-1s":                  "publish_timeout:",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: kinesis: "), err.Error())
	}
}
