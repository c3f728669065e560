package relayotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/sinks"
)

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID  = "00f067aa0ba902b7"
)

func traceparent(flags string) string { return "00-" + traceID + "-" + spanID + "-" + flags }

type env struct {
	rec   *tracetest.SpanRecorder
	hooks *relayotel.Hooks
}

func setup(t *testing.T, cfg relayotel.Config) *env {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	if cfg.System == "" {
		cfg.System = "kafka"
	}
	h, err := relayotel.New(cfg)
	require.NoError(t, err)
	return &env{rec: rec, hooks: h}
}

func msg(i int, headers map[string]string) sinks.Message {
	return sinks.Message{
		ID:      fmt.Sprintf("0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f5%d", i),
		Seq:     int64(i),
		Topic:   "orders",
		Key:     fmt.Sprintf("k%d", i),
		Payload: []byte("0123456789"),
		Headers: headers,
		Attempt: 1,
	}
}

func traced(i int) sinks.Message {
	return msg(i, map[string]string{"traceparent": traceparent("01"), "tracestate": "vendor=abc", "x-other": "1"})
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spanByMessage(t *testing.T, spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		id := attrs(s)["messaging.message.id"].AsString()
		require.NotContains(t, out, id, "two spans for message %s", id)
		out[id] = s
	}
	return out
}

func TestSpanShape(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{System: "kafka"})
	start := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	end := start.Add(3 * time.Millisecond)
	m := traced(1)
	m.Attempt = 3
	e.hooks.RecordSend(relayotel.Send{Messages: []sinks.Message{m}, Start: start, End: end})

	spans := e.rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	require.Equal(t, "send orders", s.Name())
	require.Equal(t, trace.SpanKindProducer, s.SpanKind())
	require.Equal(t, start, s.StartTime())
	require.Equal(t, end, s.EndTime())
	require.Equal(t, codes.Unset, s.Status().Code)
	require.Equal(t, relayotel.ScopeName, s.InstrumentationScope().Name)

	// Parent: the remote span named by the message's traceparent.
	require.True(t, s.Parent().IsValid())
	require.True(t, s.Parent().IsRemote())
	require.Equal(t, traceID, s.Parent().TraceID().String())
	require.Equal(t, spanID, s.Parent().SpanID().String())
	require.Equal(t, traceID, s.SpanContext().TraceID().String())
	require.NotEqual(t, spanID, s.SpanContext().SpanID().String())
	require.Equal(t, "vendor=abc", s.SpanContext().TraceState().String())

	require.Equal(t, map[attribute.Key]attribute.Value{
		"messaging.system":            attribute.StringValue("kafka"),
		"messaging.operation.type":    attribute.StringValue("send"),
		"messaging.operation.name":    attribute.StringValue("send"),
		"messaging.destination.name":  attribute.StringValue("orders"),
		"messaging.message.id":        attribute.StringValue(m.ID),
		"messaging.message.body.size": attribute.IntValue(10),
		"outbox.message.attempt":      attribute.IntValue(3),
	}, attrs(s))
}

func TestRabbitMQNamesAndDestination(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{System: "rabbitmq", Destination: func(t string) string { return "x." + t }})
	now := time.Now()
	e.hooks.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(1), traced(2)}, Start: now, End: now})
	spans := e.rec.Ended()
	require.Len(t, spans, 2)
	for _, s := range spans {
		require.Equal(t, "publish x.orders", s.Name())
		a := attrs(s)
		require.Equal(t, "publish", a["messaging.operation.name"].AsString())
		require.Equal(t, "send", a["messaging.operation.type"].AsString())
		require.Equal(t, "rabbitmq", a["messaging.system"].AsString())
		require.Equal(t, "x.orders", a["messaging.destination.name"].AsString())
		require.Equal(t, "orders", a["outbox.topic"].AsString())
		require.Equal(t, int64(2), a["outbox.batch.size"].AsInt64())
	}
}

// TestOutcomes: delivered, failed (retriable, permanent, throttled) and
// not attempted messages of one batch.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{System: "kafka"})
	boom := errors.New("broker said no")
	be := sinks.NewBatchError(5)
	be.Errs[1] = boom
	be.Errs[2] = sinks.ErrNotAttempted
	be.Errs[3] = sinks.Permanent(errors.New("message too large"))
	be.Errs[4] = &sinks.RetryAfterError{Err: errors.New("429"), After: time.Second}
	msgs := []sinks.Message{traced(0), traced(1), traced(2), traced(3), traced(4)}
	now := time.Now()
	e.hooks.RecordSend(relayotel.Send{Messages: msgs, Err: be, Start: now, End: now})

	spans := spanByMessage(t, e.rec.Ended())
	require.Len(t, spans, 4, "no span for the message that was not attempted")
	require.NotContains(t, spans, msgs[2].ID)

	require.Equal(t, codes.Unset, spans[msgs[0].ID].Status().Code)
	require.NotContains(t, attrs(spans[msgs[0].ID]), attribute.Key("error.type"))
	for i, want := range map[int]string{1: "_OTHER", 3: "permanent", 4: "throttled"} {
		s := spans[msgs[i].ID]
		require.Equal(t, codes.Error, s.Status().Code, i)
		require.Equal(t, be.Errs[i].Error(), s.Status().Description, i)
		require.Equal(t, want, attrs(s)["error.type"].AsString(), i)
	}
}

// TestWholeBatchError: an error that is not a BatchError fails every
// message.
func TestWholeBatchError(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{System: "kafka"})
	now := time.Now()
	err := fmt.Errorf("publish: %w", context.DeadlineExceeded)
	e.hooks.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(0), traced(1)}, Err: err, Start: now, End: now})
	spans := e.rec.Ended()
	require.Len(t, spans, 2)
	for _, s := range spans {
		require.Equal(t, codes.Error, s.Status().Code)
		require.Equal(t, "timeout", attrs(s)["error.type"].AsString())
	}
}

func TestWhichMessagesAreTraced(t *testing.T) {
	t.Parallel()
	now := time.Now()
	msgs := []sinks.Message{
		msg(0, nil),                         // no headers
		msg(1, map[string]string{"x": "y"}), // no trace context
		msg(2, map[string]string{"traceparent": "00-zz-yy-01"}),                            // invalid
		msg(3, map[string]string{"traceparent": traceparent("00")}),                        // not sampled
		msg(4, map[string]string{"Traceparent": traceparent("01")}),                        // other spelling
		msg(5, map[string]string{"traceparent": traceparent("01")}),                        // plain
		msg(6, map[string]string{"TRACEPARENT": "00-" + traceID + "-1111111111111111-01"}), // upper case
	}

	e := setup(t, relayotel.Config{})
	e.hooks.RecordSend(relayotel.Send{Messages: msgs, Start: now, End: now})
	spans := spanByMessage(t, e.rec.Ended())
	require.Len(t, spans, 3)
	for _, i := range []int{4, 5, 6} {
		s, ok := spans[msgs[i].ID]
		require.True(t, ok, "message %d", i)
		require.Equal(t, traceID, s.SpanContext().TraceID().String())
	}
	require.Equal(t, "1111111111111111", spans[msgs[6].ID].Parent().SpanID().String())

	// RootSpans: untraced messages get a trace of their own; the unsampled
	// parent's decision is still honoured.
	e = setup(t, relayotel.Config{RootSpans: true})
	e.hooks.RecordSend(relayotel.Send{Messages: msgs, Start: now, End: now})
	spans = spanByMessage(t, e.rec.Ended())
	require.Len(t, spans, 6)
	require.NotContains(t, spans, msgs[3].ID)
	for _, i := range []int{0, 1, 2} {
		s := spans[msgs[i].ID]
		require.False(t, s.Parent().IsValid(), "message %d is a root", i)
		require.NotEqual(t, traceID, s.SpanContext().TraceID().String())
	}
}

// TestBatchHook: the relay.Hooks entry point traces the attempted
// messages of a batch event over its send window, with the outcome of
// each.
func TestBatchHook(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{})
	var h relay.Hooks = e.hooks
	h.Lanes(3) // no-op, must not panic
	h.Batch(relay.BatchEvent{Claimed: 2})
	require.Empty(t, e.rec.Ended())

	start := time.Now()
	failed := traced(2)
	h.Batch(relay.BatchEvent{
		Claimed:      3,
		Delivered:    2,
		Retried:      1,
		Messages:     []sinks.Message{traced(0), msg(1, nil), failed},
		SendErr:      &sinks.BatchError{Errs: []error{nil, nil, errors.New("broker busy")}},
		SendStart:    start,
		SendDuration: 40 * time.Millisecond,
		Committed:    true,
	})
	spans := e.rec.Ended()
	require.Len(t, spans, 2, "one span per traced message; the untraced one has none")
	for _, s := range spans {
		require.Equal(t, 40*time.Millisecond, s.EndTime().Sub(s.StartTime()))
		require.True(t, s.StartTime().Equal(start))
		require.Equal(t, int64(3), attrs(s)["outbox.batch.size"].AsInt64())
	}
	codesSeen := map[codes.Code]int{}
	for _, s := range spans {
		codesSeen[s.Status().Code]++
	}
	require.Equal(t, map[codes.Code]int{codes.Unset: 1, codes.Error: 1}, codesSeen)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := relayotel.New(relayotel.Config{})
	require.ErrorContains(t, err, "system")
	_, err = relayotel.New(relayotel.Config{System: "  "})
	require.ErrorContains(t, err, "system")
	// Without a provider, the global one is used (a no-op by default).
	h, err := relayotel.New(relayotel.Config{System: "kafka"})
	require.NoError(t, err)
	h.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(1)}, Start: time.Now(), End: time.Now()})
}

func TestLongErrorIsBounded(t *testing.T) {
	t.Parallel()
	e := setup(t, relayotel.Config{})
	long := errors.New(strings.Repeat("é", 3000))
	now := time.Now()
	e.hooks.RecordSend(relayotel.Send{Messages: []sinks.Message{traced(1)}, Err: long, Start: now, End: now})
	spans := e.rec.Ended()
	require.Len(t, spans, 1)
	d := spans[0].Status().Description
	require.LessOrEqual(t, len(d), 1024+len("…"))
	require.True(t, utf8.ValidString(d))
	require.True(t, strings.HasSuffix(d, "é…"))
}
