package snssink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// TestConformance runs the shared suite against goaws: each topic is an
// SNS topic with an SQS queue subscribed with raw message delivery, read
// back as the consumer. Base64 bodies.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			MaxPayload: 190 << 10, NoEmptyPayload: true,
			Why: map[string]string{
				"Partitions":     "an SNS topic has no partitions",
				"MaxPayload":     "an SNS message is at most 256 KiB with its attributes, and base64 makes the payload a third larger",
				"NoEmptyPayload": "SNS refuses an empty message",
			}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t, srv, withConfig(func(c *Config) { c.BodyEncoding = "base64" }))
			var mu sync.Mutex
			var topics []string
			return &sinktest.Env{
				Sink: e.sink,
				Topic: func(suffix string) string {
					topic := e.topic(suffix)
					mu.Lock()
					topics = append(topics, topic)
					mu.Unlock()
					return topic
				},
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					var out []sinktest.Delivered
					for len(out) < n {
						mu.Lock()
						ts := append([]string(nil), topics...)
						mu.Unlock()
						got := 0
						for _, topic := range ts {
							ms, err := e.receiveOnce(topic, n-len(out))
							if err != nil {
								return out, err
							}
							for _, m := range ms {
								out = append(out, delivered(topic, m, true))
							}
							got += len(ms)
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
					// To a topic that does not exist: SNS refuses it.
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

// TestTextMessages: text payloads go as they are, with every attribute,
// in order per key.
func TestTextMessages(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t))
	ctx := context.Background()
	topic := e.topic("text")
	batch := msgs(topic, 30, 4, 20)
	batch[0].Headers = map[string]string{"type": "OrderPlaced", "trace.id": "abc"}
	require.NoError(t, e.sink.Send(ctx, batch))
	got, err := e.receive(ctx, topic, len(batch))
	require.NoError(t, err)
	byID := map[string]sinks.Message{}
	for _, m := range batch {
		byID[m.ID] = m
	}
	last := map[string]int64{}
	for _, m := range got {
		d := delivered(topic, m, false)
		sent, ok := byID[d.ID]
		require.True(t, ok, d.ID)
		delete(byID, d.ID)
		require.Equal(t, sent.Key, d.Key)
		require.Equal(t, string(sent.Payload), string(d.Payload))
		if len(sent.Headers) > 0 {
			require.Equal(t, sent.Headers, d.Headers)
		}
		require.Greater(t, sent.Seq, last[sent.Key], "in order per key")
		last[sent.Key] = sent.Seq
	}
	require.Empty(t, byID)
}

// TestFIFOEntry pins the FIFO fields, as SNS documents them for FIFO
// topics: MessageGroupId the key (keyless: the message id),
// MessageDeduplicationId the message id. goaws has no FIFO topics, so
// this checks the entry the sink builds, not a server's answer.
func TestFIFOEntry(t *testing.T) {
	t.Parallel()
	s, err := New(Config{TopicARN: "arn:aws:sns:eu-west-1:1:{topic}", Region: "eu-west-1", AccessKeyID: "a", SecretAccessKey: "b"}, nil)
	require.NoError(t, err)
	m := sinktest.Msg("orders.fifo", "order-1", 7, []byte("x"))
	e, err := s.entry(0, m)
	require.NoError(t, err)
	in := toEntry(e)
	require.Equal(t, "arn:aws:sns:eu-west-1:1:orders.fifo", e.Dest)
	require.Equal(t, "order-1", aws.ToString(in.MessageGroupId))
	require.Equal(t, m.ID, aws.ToString(in.MessageDeduplicationId))
	require.Equal(t, m.ID, aws.ToString(in.MessageAttributes[AttrID].StringValue))
	m.Key = ""
	e, err = s.entry(0, m)
	require.NoError(t, err)
	require.Equal(t, m.ID, aws.ToString(toEntry(e).MessageGroupId), "keyless: its own group")
	e, err = s.entry(0, sinktest.Msg("orders", "k", 1, []byte("x")))
	require.NoError(t, err)
	require.Nil(t, toEntry(e).MessageGroupId, "standard topic")
}

// TestRefusedBeforeSending: what SNS would refuse for the message itself
// is dead-lettered with the reason, and stops only its key.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t))
	ctx := context.Background()
	topic := e.topic("refused")
	for _, c := range []struct {
		mod  func(m *sinks.Message)
		want string
	}{
		{func(m *sinks.Message) { m.Payload = []byte{0xff} }, "not valid UTF-8"},
		{func(m *sinks.Message) { m.Payload = nil }, "empty"},
		{func(m *sinks.Message) { m.Headers = map[string]string{"a b": "v"} }, "holds only"},
	} {
		bad := sinktest.Msg(topic, "k", 1, []byte("x"))
		c.mod(&bad)
		batch := []sinks.Message{bad, sinktest.Msg(topic, "k", 2, []byte("after")), sinktest.Msg(topic, "other", 3, []byte("other"))}
		err := e.sink.Send(ctx, batch)
		be := &sinks.BatchError{}
		require.ErrorAs(t, err, &be, c.want)
		require.True(t, sinks.IsPermanent(be.Errs[0]), "%s: %v", c.want, be.Errs[0])
		require.ErrorIs(t, be.Errs[0], ErrInvalid)
		require.ErrorContains(t, be.Errs[0], c.want)
		require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted, c.want)
		require.NoError(t, be.Errs[2], c.want)
	}
}

// TestStoppedIsNotAttempted: an endpoint that refuses connections costs
// no attempt; the sink publishes again once it is back.
func TestStoppedIsNotAttempted(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	e := setup(t, srv, withConfig(func(c *Config) { c.PublishTimeout = 2 * time.Second }), direct())
	ctx := context.Background()
	topic := e.topic("down")
	require.NoError(t, e.sink.Send(ctx, msgs(topic, 1, 1, 1)))
	srv.Stop()
	batch := msgs(topic, 3, 2, 1)
	var err error
	for range 3 { // a pooled connection cut under a Send is an attempt
		if err = e.sink.Send(ctx, batch); errors.Is(sinks.Outcome(err, 0, 3), sinks.ErrNotAttempted) {
			break
		}
	}
	for i := range batch {
		require.ErrorIs(t, sinks.Outcome(err, i, 3), sinks.ErrNotAttempted, "%v", err)
	}
	srv.Start()
	require.NoError(t, e.sink.Send(ctx, batch))
}

// TestEntryErrors: SNS's per-entry codes, sorted into retriable and
// permanent.
func TestEntryErrors(t *testing.T) {
	t.Parallel()
	for code, perm := range map[string]bool{
		"InvalidParameter": true, "InvalidParameterValue": true, "NotFound": true,
		"AWS.SimpleNotificationService.NonExistentTopic": true,
		"Throttled": false, "InternalError": false, "KMSThrottling": false, "AuthorizationError": false,
	} {
		err := entryErr("t", types.BatchResultErrorEntry{Id: aws.String("0"), Code: aws.String(code), Message: aws.String("m"), SenderFault: true})
		require.Equal(t, perm, sinks.IsPermanent(err), code)
		require.ErrorIs(t, err, ErrRefused)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("sns://?topic_arn=arn:aws:sns:eu-west-1:1:{topic}&region=eu-west-1&access_key_id=AK&secret_access_key=s3cret")
	require.NoError(t, err)
	require.Equal(t, "arn:aws:sns:eu-west-1:1:{topic}", c.TopicARN)
	require.NotContains(t, c.Redacted(), "s3cret")
	for raw, want := range map[string]string{
		"sns://?topic_arn=x&bogus=1":                  `unknown sink URL parameter "bogus"`,
		"sns://":                                      "topic_arn: required",
		"sns://host?topic_arn=x":                      "want sns://?topic_arn=",
		"sns://?topic_arn={nope}":                     "topic_arn: unknown placeholder",
		"sns://?topic_arn=x&max_message_bytes=300000": "max_message_bytes:",
		"sns://?topic_arn=x&secret_access_key=s":      "set together",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: sns: "), err.Error())
	}
}
