// Package relayotel traces a relay with OpenTelemetry. Hooks implements
// relay.Hooks: each message a sink attempted becomes a producer span,
// child of the trace context the application stored with the message (its
// W3C traceparent and tracestate headers), so a consumer's trace continues
// the writer's trace through the outbox. Setup configures OpenTelemetry
// from the standard OTEL_* environment variables: OTLP exporters over gRPC
// or HTTP for the spans and for metrics read from a producer (the relay
// gives it its Prometheus registry, so that OTLP and /metrics show the
// same metrics), exporting nothing until a variable asks for it.
// Inject, the writer-side helper that stores the current trace context in
// a message's headers, is outboxotel.Inject (outbox/outboxotel), kept
// here for code that already calls it.
//
// The relay and sink packages know nothing of OpenTelemetry; this package
// is the only place on the relay side that imports it (outbox/outboxotel
// is its writer-side counterpart). It defines no metric of its own: the
// relay's metrics are relay/relayprom's. See docs/tracing.md.
package relayotel

import (
	"context"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// ScopeName is the instrumentation scope of the spans this package makes.
const ScopeName = "github.com/outbox-relay/outbox-relay/relay/relayotel"

// Attributes this package adds besides the messaging semantic
// conventions.
const (
	// AttrAttempt is the delivery attempt of the message, 1 on the first.
	AttrAttempt = attribute.Key("outbox.message.attempt")
	// AttrBatchSize is how many messages the sink call that carried the
	// message held (the span itself describes one message).
	AttrBatchSize = attribute.Key("outbox.batch.size")
	// AttrTopic is the outbox topic, set when Config.Destination maps it
	// to a different destination name.
	AttrTopic = attribute.Key("outbox.topic")
)

// maxStatusLen bounds the error text put in a span's status.
const maxStatusLen = 1024

// Config configures Hooks. The zero value of every optional field means
// its default.
type Config struct {
	// System is messaging.system: "kafka", "rabbitmq", or a custom value
	// for other sinks ("webhook" for HTTP). Required.
	System string
	// OperationName is messaging.operation.name and the first word of the
	// span name. Default: "publish" for rabbitmq, "send" otherwise (the
	// names the semantic conventions give those systems).
	OperationName string
	// TracerProvider creates the spans. Default: the global provider
	// (otel.GetTracerProvider()) at the time New is called; Setup installs
	// one.
	TracerProvider trace.TracerProvider
	// Destination maps an outbox topic to messaging.destination.name, for
	// sinks that rename topics (a Kafka topic prefix or map) or publish to
	// a fixed destination (RabbitMQ: the exchange). When it differs from
	// the topic, the topic is kept in outbox.topic. Default: the topic
	// itself.
	Destination func(topic string) string
	// RootSpans also traces messages that carry no trace context, each as
	// the root span of a trace of its own (subject to the provider's
	// sampler). Default false: only messages written inside a trace are
	// traced, which keeps an untraced firehose from producing a trace per
	// message.
	RootSpans bool
}

// Hooks implements relay.Hooks with OpenTelemetry spans. It is safe for
// concurrent use.
type Hooks struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	op     string
	dest   func(string) string
	root   bool
	static []attribute.KeyValue
}

var _ relay.Hooks = (*Hooks)(nil)

// New returns Hooks for cfg.
func New(cfg Config) (*Hooks, error) {
	if strings.TrimSpace(cfg.System) == "" {
		return nil, errors.New("outbox: tracing: system: required (kafka, rabbitmq, webhook, ...)")
	}
	op := cfg.OperationName
	if op == "" {
		op = "send"
		if cfg.System == "rabbitmq" {
			op = "publish"
		}
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	dest := cfg.Destination
	if dest == nil {
		dest = func(t string) string { return t }
	}
	return &Hooks{
		tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		// The relay reads W3C Trace Context whatever propagator the
		// process has installed: that is the format Inject guarantees and
		// other languages' writers use.
		prop: propagation.TraceContext{},
		op:   op,
		dest: dest,
		root: cfg.RootSpans,
		static: []attribute.KeyValue{
			semconv.MessagingSystemKey.String(cfg.System),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName(op),
		},
	}, nil
}

// Send describes one call of a sink's Send.
type Send struct {
	// Messages are the messages handed to the sink, in order.
	Messages []sinks.Message
	// Err is what Send returned: nil when every message was delivered, a
	// *sinks.BatchError for per-message outcomes, any other error for all.
	Err error
	// Start is when the batch was handed to the sink; End is when Send
	// returned (the ack).
	Start, End time.Time
	// BatchSize is how many messages the call carried. Default
	// len(Messages).
	BatchSize int
}

// RecordSend records one producer span per message the sink attempted:
// started at s.Start, ended at s.End, with an error status when the
// message failed. A message reported as sinks.ErrNotAttempted gets no
// span; nor does a message without a valid traceparent header unless
// Config.RootSpans is set.
func (h *Hooks) RecordSend(s Send) {
	n := len(s.Messages)
	batch := s.BatchSize
	if batch == 0 {
		batch = n
	}
	for i, m := range s.Messages {
		err := sinks.Outcome(s.Err, i, n)
		if errors.Is(err, sinks.ErrNotAttempted) {
			continue
		}
		h.span(m, err, s.Start, s.End, batch)
	}
}

func (h *Hooks) span(m sinks.Message, err error, start, end time.Time, batch int) {
	ctx := context.Background()
	if len(m.Headers) > 0 {
		ctx = h.prop.Extract(ctx, headerCarrier(m.Headers))
	}
	if !h.root && !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	dest := h.dest(m.Topic)
	attrs := make([]attribute.KeyValue, 0, len(h.static)+6)
	attrs = append(attrs, h.static...)
	attrs = append(attrs,
		semconv.MessagingDestinationName(dest),
		semconv.MessagingMessageID(m.ID),
		semconv.MessagingMessageBodySize(len(m.Payload)),
	)
	if dest != m.Topic {
		attrs = append(attrs, AttrTopic.String(m.Topic))
	}
	if m.Attempt > 0 {
		attrs = append(attrs, AttrAttempt.Int(m.Attempt))
	}
	if batch > 1 {
		attrs = append(attrs, AttrBatchSize.Int(batch))
	}
	_, span := h.tracer.Start(ctx, h.op+" "+dest,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(start),
		trace.WithAttributes(attrs...),
	)
	if err != nil && span.IsRecording() {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		msg := err.Error()
		if len(msg) > maxStatusLen {
			cut := maxStatusLen
			for cut > 0 && !utf8.RuneStart(msg[cut]) {
				cut--
			}
			msg = msg[:cut] + "…"
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End(trace.WithTimestamp(end))
}

// errorType classifies a failure with low cardinality, as error.type
// wants.
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case sinks.IsPermanent(err):
		return "permanent"
	}
	if _, ok := sinks.RetryAfter(err); ok {
		return "throttled"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// Batch implements relay.Hooks.
//
// relay.BatchEvent does not yet carry the messages that failed nor the
// time the batch was handed to the sink, so for now Batch traces the
// delivered messages only, with the send window derived from the event's
// durations (the hook runs right after the settle).
func (h *Hooks) Batch(ev relay.BatchEvent) {
	if len(ev.Messages) == 0 {
		return
	}
	h.RecordSend(Send{
		Messages:  ev.Messages,
		Err:       ev.SendErr,
		Start:     ev.SendStart,
		End:       ev.SendStart.Add(ev.SendDuration),
		BatchSize: ev.Claimed,
	})
}

// Lanes implements relay.Hooks; lane ownership is not traced.
func (h *Hooks) Lanes(int) {}

// CycleError, UnworkedLanes, RouteConfigs, Outage, RouteState and Wakeup
// implement relay.Hooks: none of them is traced.
func (h *Hooks) CycleError(error)              {}
func (h *Hooks) UnworkedLanes(int)             {}
func (h *Hooks) RouteConfigs(int)              {}
func (h *Hooks) Outage(bool, time.Time, error) {}
func (h *Hooks) RouteState(relay.RouteState)   {}
func (h *Hooks) Wakeup(string, bool, error)    {}

// headerCarrier reads trace context from message headers: the exact
// lower-case name first (what Inject writes), else any spelling, because
// writers in other languages may capitalise header names.
type headerCarrier map[string]string

func (c headerCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
