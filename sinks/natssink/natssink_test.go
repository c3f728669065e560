package natssink

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true, Dedup: true,
			Why: map[string]string{"Partitions": "a JetStream stream has no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t)
			return &sinktest.Env{
				Sink:  e.sink,
				Topic: e.topic,
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					ms, err := e.read(ctx, n)
					out := make([]sinktest.Delivered, len(ms))
					for i, m := range ms {
						out[i] = delivered(m)
					}
					return out, err
				},
				Poison: func(topic string) sinks.Message {
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": "nostream."}
					return m
				},
				// A full stream with discard new refuses every publish.
				BreakTransient: e.fillStream,
				// The sink's connection is cut (through the proxy); the
				// shared server is never restarted.
				Restart: e.proxy.Restart,
				Down:    e.proxy.Down,
				Up:      e.proxy.Up,
			}
		},
	})
}

// TestDuplicateDroppedByServer: the same message published twice (a relay
// that crashed after the ack, before its commit) is stored once.
func TestDuplicateDroppedByServer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	batch := sinktest.Batch(e.topic("dup"), 50, 5, 10)
	require.NoError(t, e.sink.Send(ctx, batch))
	require.NoError(t, e.sink.Send(ctx, batch), "a duplicate is a success")
	require.NoError(t, e.sink.Send(ctx, batch[10:20]))
	require.Equal(t, uint64(50), e.count(ctx), "the stream holds each message once")
	got, err := e.read(ctx, 50)
	require.NoError(t, err)
	for i, m := range got {
		require.Equal(t, batch[i].ID, m.Header.Get(HeaderMsgID))
	}
}

// TestNoStreamIsPermanent: a subject no stream covers is dead-lettered
// with "no stream"; other keys flow, later messages of its key wait.
func TestNoStreamIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Subject = "{topic}" }))
	ok := e.topic("ok")
	batch := []sinks.Message{
		sinktest.Msg(ok, "a", 1, []byte("1")),
		sinktest.Msg("nowhere."+e.prefix, "b", 2, []byte("2")),
		sinktest.Msg(ok, "b", 3, []byte("3")),
		sinktest.Msg(ok, "", 4, []byte("4")),
	}
	err := e.sink.Send(context.Background(), batch)
	be := &sinks.BatchError{}
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.True(t, sinks.IsPermanent(be.Errs[1]), "%v", be.Errs[1])
	require.ErrorIs(t, be.Errs[1], ErrNoStream)
	require.Contains(t, be.Errs[1].Error(), "no stream")
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	require.Equal(t, uint64(2), e.count(context.Background()))
}

// TestTooLargeIsPermanent: over the server's max_payload, refused before
// sending; over the stream's max_msg_size, refused by the server. Both
// are permanent.
func TestTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t, withStream(func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1000 }))
	ctx := context.Background()
	topic := e.topic("big")
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "w", 1, []byte("warm"))}))
	max := e.sink.nc.MaxPayload()
	batch := []sinks.Message{
		sinktest.Msg(topic, "a", 2, make([]byte, max+1)),
		sinktest.Msg(topic, "b", 3, make([]byte, 2000)),
		sinktest.Msg(topic, "c", 4, make([]byte, 10)),
	}
	err := e.sink.Send(ctx, batch)
	for i := range 2 {
		e := sinks.Outcome(err, i, 3)
		require.True(t, sinks.IsPermanent(e), "message %d: %v", i, e)
		require.ErrorIs(t, e, ErrTooLarge)
	}
	require.NoError(t, sinks.Outcome(err, 2, 3))
}

// TestStreamFullIsRetriedInOrder: a full stream (discard new) fails a
// message as retriable, and the later messages of its key are not
// published, so they can never be stored before it.
func TestStreamFullIsRetriedInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topic := e.topic("full")
	first := sinktest.Batch(topic, 3, 1, 10)
	require.NoError(t, e.sink.Send(ctx, first[:1]))
	restore := e.fillStream()
	err := e.sink.Send(ctx, first[1:])
	require.False(t, sinks.IsPermanent(sinks.Outcome(err, 0, 2)), "%v", err)
	require.Error(t, sinks.Outcome(err, 0, 2))
	require.ErrorIs(t, sinks.Outcome(err, 1, 2), sinks.ErrNotAttempted)
	restore()
	require.NoError(t, e.sink.Send(ctx, first[1:]))
	got, err := e.read(ctx, 3)
	require.NoError(t, err)
	for i, m := range got {
		require.Equal(t, first[i].ID, m.Header.Get(HeaderMsgID))
	}
}

// TestHeaderInjectionIsPermanent: a header that would break the NATS
// header block is refused, and nothing of it reaches the server.
func TestHeaderInjectionIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	topic := e.topic("inj")
	bad := []sinks.Message{
		sinktest.Msg(topic, "a", 1, []byte("1")),
		sinktest.Msg(topic, "b", 2, []byte("2")),
		sinktest.Msg(topic, "c", 3, []byte("3")),
		sinktest.Msg(topic, "d", 4, []byte("4")),
	}
	bad[0].Headers = map[string]string{"x": "v\r\nNats-Msg-Id: forged"}
	bad[1].Headers = map[string]string{"a b": "v"}
	bad[2].Headers = map[string]string{"Nats-Expected-Stream": "x"}
	err := e.sink.Send(context.Background(), bad)
	for i := range 3 {
		require.True(t, sinks.IsPermanent(sinks.Outcome(err, i, 4)), "message %d: %v", i, sinks.Outcome(err, i, 4))
	}
	require.NoError(t, sinks.Outcome(err, 3, 4))
}

// TestLargeBatchOrderPerKey: rounds keep every key in order in a batch
// larger than the async window.
func TestLargeBatchOrderPerKey(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.MaxPending = 64 }))
	ctx := context.Background()
	batch := sinktest.Batch(e.topic("large"), 1000, 7, 20)
	require.NoError(t, e.sink.Send(ctx, batch))
	got, err := e.read(ctx, len(batch))
	require.NoError(t, err)
	last := map[string]int{}
	idx := map[string]int{}
	for i, m := range batch {
		idx[m.ID] = i
	}
	for _, m := range got {
		i := idx[m.Header.Get(HeaderMsgID)]
		k := batch[i].Key
		if p, ok := last[k]; ok {
			require.Greater(t, i, p, "key %s out of order", k)
		}
		last[k] = i
	}
}

// TestPipelinedOrderPerKey: ordering=pipelined publishes a batch at once;
// on a healthy stream every key still arrives in order.
func TestPipelinedOrderPerKey(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Ordering = OrderingPipelined; c.Subject = "{topic}" }))
	ctx := context.Background()
	batch := sinktest.Batch(e.topic("pipelined"), 1000, 3, 20)
	// A message refused before sending still stops its key.
	batch[10].Headers = map[string]string{"bad": "a\r\nb"}
	err := e.sink.Send(ctx, batch)
	require.True(t, sinks.IsPermanent(sinks.Outcome(err, 10, len(batch))))
	for i := 11; i < len(batch); i++ {
		if batch[i].Key == batch[10].Key {
			require.ErrorIs(t, sinks.Outcome(err, i, len(batch)), sinks.ErrNotAttempted)
		} else {
			require.NoError(t, sinks.Outcome(err, i, len(batch)))
		}
	}
	n := 0
	for i := range batch {
		if sinks.Outcome(err, i, len(batch)) == nil {
			n++
		}
	}
	got, err := e.read(ctx, n)
	require.NoError(t, err)
	idx := map[string]int{}
	for i, m := range batch {
		idx[m.ID] = i
	}
	last := map[string]int{}
	for _, m := range got {
		i := idx[m.Header.Get(HeaderMsgID)]
		if p, ok := last[batch[i].Key]; ok {
			require.Greater(t, i, p)
		}
		last[batch[i].Key] = i
	}
}

// TestDisconnectedIsNotAttempted: with the server unreachable, nothing is
// sent, the messages are reported not attempted (no attempt counted), and
// the sink delivers again once the server is back.
func TestDisconnectedIsNotAttempted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topic := e.topic("down")
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 1)))
	restore := e.proxy.Break()
	require.Eventually(t, func() bool { return e.sink.Healthy(ctx) != nil }, 5*time.Second, 5*time.Millisecond)
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	batch := sinktest.Batch(topic, 3, 2, 1)
	err := e.sink.Send(sctx, batch)
	cancel()
	for i := range batch {
		require.ErrorIs(t, sinks.Outcome(err, i, 3), sinks.ErrNotAttempted, "%v", err)
		require.ErrorIs(t, sinks.Outcome(err, i, 3), ErrNotConnected)
	}
	restore()
	require.NoError(t, e.sink.Send(ctx, batch))
	require.NoError(t, e.sink.Healthy(ctx))
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("nats://u:p%40ss@h1:4222,h2:4223?subject=ev.{topic}&stream=EV&publish_timeout=5s&tls_ca_file=/ca.pem")
	require.NoError(t, err)
	require.Equal(t, "ev.{topic}", c.Subject)
	require.Equal(t, "EV", c.Stream)
	require.Equal(t, 5*time.Second, c.PublishTimeout)
	require.Equal(t, "/ca.pem", c.TLS.CAFile)
	srv, err := servers(c.URL)
	require.NoError(t, err)
	require.Equal(t, []string{"nats://h1:4222", "nats://h2:4223"}, srv)
	red := c.Redacted()
	require.NotContains(t, red, "p%40ss")
	require.NotContains(t, red, "p@ss")
	c, err = ParseURL("nats://s3cr3t@h:4222?token=tok3n")
	require.NoError(t, err)
	require.NotContains(t, c.Redacted(), "s3cr3t")
	require.NotContains(t, c.Redacted(), "tok3n")
	for raw, want := range map[string]string{
		"nats://h:4222?bogus=1":                               `unknown sink URL parameter "bogus"`,
		"nats://h:4222?subject={nope}":                        "subject: unknown placeholder {nope}",
		"nats://h:4222?stream=a.b":                            "stream:",
		"nats://h:4222?create_stream=true":                    "stream: required with create_stream",
		"nats://h:4222?stream=S&create_stream=true":           "stream_subjects: required",
		"nats://h:99999":                                      "port must be between",
		"http://h:4222":                                       "scheme must be nats",
		"nats://h:4222?token=a&creds_file=/c":                 "exclusive",
		"nats://h:4222?tls_cert_file=/c.pem":                  "cert_file and key_file must be set together",
		"nats://h:4222?reconnect_initial=2s&reconnect_max=1s": "reconnect_max",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
	}
}

// JetStream unavailable as a whole (503), and a publish whose ack did not
// come, wrap sinks.ErrUnavailable; other refusals of the stream do not.
func TestOutageClassification(t *testing.T) {
	t.Parallel()
	s := &Sink{}
	for _, err := range []error{
		&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"},
		jetstream.ErrAsyncPublishTimeout, nats.ErrDisconnected,
	} {
		got := s.ackErr(t.Context(), "s", err)
		require.ErrorIs(t, got, sinks.ErrUnavailable, "%v", err)
		require.False(t, sinks.IsPermanent(got))
	}
	full := &jetstream.APIError{Code: 400, ErrorCode: 10077, Description: "maximum messages exceeded"}
	require.NotErrorIs(t, s.ackErr(t.Context(), "s", full), sinks.ErrUnavailable)
}
