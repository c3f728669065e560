package sqssink

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
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// TestConformance runs the shared suite against goaws, on FIFO queues
// (one per topic) with base64 bodies. Dedup stays off: goaws forgets a
// deduplication id once its message is deleted, where SQS keeps it for
// the whole five-minute window; TestFIFODeduplication checks the
// deduplication within what goaws keeps.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			MaxPayload: 190 << 10, NoEmptyPayload: true,
			Why: map[string]string{
				"Partitions":     "an SQS queue has no partitions",
				"MaxPayload":     "an SQS message is at most 256 KiB with its attributes, and base64 makes the payload a third larger",
				"NoEmptyPayload": "an SQS message body has at least one character",
			}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t, srv, withConfig(func(c *Config) { c.BodyEncoding = "base64" }))
			var mu sync.Mutex
			var topics []string
			return &sinktest.Env{
				Sink: e.sink,
				Topic: func(suffix string) string {
					topic := e.queue(suffix, true)
					mu.Lock()
					topics = append(topics, topic)
					mu.Unlock()
					return topic
				},
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					// One pass over the topics at a time, each receive
					// uncancelled: a receive cut short after the server
					// answered would hide its messages for the visibility
					// timeout.
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
					// To a queue that does not exist: SQS refuses it.
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

// TestStandardQueue: on a standard queue every message arrives with its
// attributes and no group or deduplication id; text bodies go as they
// are.
func TestStandardQueue(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t))
	ctx := context.Background()
	topic := e.queue("std", false)
	batch := msgs(topic, 25, 3, 20)
	batch[0].Headers = map[string]string{"type": "OrderPlaced", "trace.id": "abc"}
	batch[1].Key = ""
	require.NoError(t, e.sink.Send(ctx, batch))
	for _, m := range batch {
		require.Nil(t, toEntry(e.sink.mustEntry(t, m)).MessageGroupId)
	}
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
		require.Equal(t, sent.Seq, seqOf(m))
		require.Equal(t, string(sent.Payload), string(d.Payload))
		require.Equal(t, sent.Headers, map[string]string(nilIfEmpty(d.Headers)))
		require.Greater(t, sent.Seq, last[sent.Key], "in order per key")
		last[sent.Key] = sent.Seq
	}
	require.Empty(t, byID)
}

func nilIfEmpty(h map[string]string) map[string]string {
	if len(h) == 0 {
		return nil
	}
	return h
}

// mustEntry builds m's entry.
func (s *Sink) mustEntry(t *testing.T, m sinks.Message) *awsbatch.Entry {
	t.Helper()
	e, err := s.entry(0, m)
	require.NoError(t, err)
	return e
}

// TestFIFOEntry pins what the FIFO fields are, as SQS documents them:
// MessageGroupId the key (keyless: the message id), MessageDeduplicationId
// the message id. goaws checks neither against SQS's rules.
func TestFIFOEntry(t *testing.T) {
	t.Parallel()
	s, err := New(Config{QueueURL: "https://sqs.eu-west-1.amazonaws.com/1/{topic}", Region: "eu-west-1",
		AccessKeyID: "a", SecretAccessKey: "b"}, nil)
	require.NoError(t, err)
	m := sinktest.Msg("orders.fifo", "order-1", 7, []byte("x"))
	e := toEntry(s.mustEntry(t, m))
	require.Equal(t, "order-1", aws.ToString(e.MessageGroupId))
	require.Equal(t, m.ID, aws.ToString(e.MessageDeduplicationId))
	require.Equal(t, "https://sqs.eu-west-1.amazonaws.com/1/orders.fifo", s.mustEntry(t, m).Dest)
	m.Key = ""
	require.Equal(t, m.ID, aws.ToString(toEntry(s.mustEntry(t, m)).MessageGroupId), "keyless: its own group")
	require.Nil(t, toEntry(s.mustEntry(t, sinktest.Msg("orders", "k", 1, []byte("x")))).MessageGroupId, "standard queue")
}

// TestFIFODeduplication: a redelivery of a message (same id) into a FIFO
// queue is dropped by the server within its deduplication window.
func TestFIFODeduplication(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t))
	ctx := context.Background()
	topic := e.queue("dedup", true)
	batch := msgs(topic, 4, 2, 10)
	require.NoError(t, e.sink.Send(ctx, batch))
	require.NoError(t, e.sink.Send(ctx, batch[1:3]))
	got, err := e.receive(ctx, topic, 4)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	more, _ := e.receive(rctx, topic, 1)
	require.Empty(t, more, "the resent messages were dropped")
	for i, m := range got {
		require.Equal(t, batch[i].ID, aws.ToString(m.MessageAttributes[AttrID].StringValue))
	}
}

// TestRefusedBeforeSending: what SQS would refuse for the message itself
// is dead-lettered with the reason, and stops only its key.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t), withConfig(func(c *Config) { c.MaxMessageBytes = 2048 }))
	ctx := context.Background()
	topic := e.queue("refused", false)
	many := map[string]string{}
	for i := range 8 {
		many[fmt.Sprintf("h%d", i)] = "v"
	}
	cases := []struct {
		mod  func(m *sinks.Message)
		want string
	}{
		{func(m *sinks.Message) { m.Payload = []byte{0xff} }, "not valid UTF-8"},
		{func(m *sinks.Message) { m.Payload = []byte("a\x00b") }, "U+0000"},
		{func(m *sinks.Message) { m.Payload = nil }, "empty"},
		{func(m *sinks.Message) { m.Payload = bytes.Repeat([]byte("a"), 3000) }, "above max_message_bytes"},
		{func(m *sinks.Message) { m.Headers = many }, "a message takes 10 attributes"},
		{func(m *sinks.Message) { m.Headers = map[string]string{"a b": "v"} }, "holds only"},
		{func(m *sinks.Message) { m.Headers = map[string]string{"AWS.x": "v"} }, `"AWS."`},
		{func(m *sinks.Message) { m.Headers = map[string]string{"x": ""} }, "empty attribute value"},
		{func(m *sinks.Message) { m.Headers = map[string]string{AttrID: "forged"} }, "sink's own"},
	}
	for _, c := range cases {
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
	got, err := e.receive(ctx, topic, len(cases))
	require.NoError(t, err)
	for _, m := range got {
		require.Equal(t, "other", aws.ToString(m.Body))
	}
}

// TestRequestsSplit: a batch wider than one request goes out as several
// (at most 10 entries and max_message_bytes each), never two messages of
// one key in one request, and arrives whole and in order per key.
func TestRequestsSplit(t *testing.T) {
	t.Parallel()
	e := setup(t, throwaway.StartGoAWS(t), withConfig(func(c *Config) { c.MaxMessageBytes = 4096 }))
	ctx := context.Background()
	topic := e.queue("split", true)
	batch := msgs(topic, 120, 15, 500)
	require.NoError(t, e.sink.Send(ctx, batch))
	got, err := e.receive(ctx, topic, len(batch))
	require.NoError(t, err)
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range got {
		k := aws.ToString(m.MessageAttributes[AttrKey].StringValue)
		require.Greater(t, seqOf(m), last[k], "key %s in order", k)
		last[k] = seqOf(m)
		seen[aws.ToString(m.MessageAttributes[AttrID].StringValue)] = true
	}
	require.Len(t, seen, len(batch))
}

// TestStoppedIsNotAttempted: an endpoint that refuses connections costs
// no attempt; the sink delivers again once it is back.
func TestStoppedIsNotAttempted(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	e := setup(t, srv, withConfig(func(c *Config) { c.PublishTimeout = 2 * time.Second }), direct())
	ctx := context.Background()
	topic := e.queue("down", false)
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
		require.False(t, sinks.IsPermanent(sinks.Outcome(err, i, 3)))
	}
	srv.Start()
	require.NoError(t, e.sink.Send(ctx, batch))
}

// TestEntryErrors: SQS's per-entry codes, sorted into retriable and
// permanent.
func TestEntryErrors(t *testing.T) {
	t.Parallel()
	for code, perm := range map[string]bool{
		"InvalidParameterValue": true, "InvalidMessageContents": true, "MessageTooLong": true,
		"AWS.SimpleQueueService.NonExistentQueue": true,
		"ThrottlingException":                     false, "RequestThrottled": false, "InternalError": false, "ServiceUnavailable": false,
		"KMS.ThrottlingException": false, "AccessDenied": false,
	} {
		err := entryErr("q", typesEntry(code))
		require.Equal(t, perm, sinks.IsPermanent(err), code)
		require.ErrorIs(t, err, ErrRefused)
		require.ErrorContains(t, err, code)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("sqs://?queue_url=https://sqs.eu-west-1.amazonaws.com/1/{topic}&region=eu-west-1&access_key_id=AK&secret_access_key=s3cret&body_encoding=base64")
	require.NoError(t, err)
	require.Equal(t, "https://sqs.eu-west-1.amazonaws.com/1/{topic}", c.QueueURL)
	require.Equal(t, "base64", c.BodyEncoding)
	require.NotContains(t, c.Redacted(), "s3cret")
	require.Contains(t, c.Redacted(), "secret_access_key=xxxxx")
	for raw, want := range map[string]string{
		"sqs://?queue_url=x&bogus=1":                   `unknown sink URL parameter "bogus"`,
		"sqs://":                                       "queue_url: required",
		"sqs://host?queue_url=x":                       "want sqs://?queue_url=",
		"sqs://?queue_url={nope}":                      "queue_url: unknown placeholder",
		"sqs://?queue_url=x&protocol=xml":              "protocol:",
		"sqs://?queue_url=x&body_encoding=hex":         "body_encoding:",
		"sqs://?queue_url=x&access_key_id=a":           "set together",
		"sqs://?queue_url=x&max_message_bytes=2000000": "max_message_bytes:",
		"sqs://?queue_url=x&endpoint=127.0.0.1:4100":   "endpoint:",
		"sqs://?queue_url=x&concurrency=-1":            "concurrency:",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: sqs: "), err.Error())
	}
}

func typesEntry(code string) types.BatchResultErrorEntry {
	return types.BatchResultErrorEntry{Id: aws.String("0"), Code: aws.String(code), Message: aws.String("m"), SenderFault: true}
}
