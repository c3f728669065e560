// Package format turns outbox messages into a wire format before a sink
// publishes them: CloudEvents 1.0 in binary content mode (per protocol
// binding: Kafka, HTTP, AMQP) and a mode compatible with Debezium's outbox
// event router. A format is applied with Wrap, a sinks.Sink decorator, so
// the sinks themselves stay format-agnostic.
//
// Formats only add or rename headers; the payload is delivered byte for
// byte and the key is left alone. The package has no broker dependencies.
// See docs/formats.md for the exact header names of each binding.
package format

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Format rewrites one message for the wire.
type Format interface {
	// Name is the name Parse accepts for this format.
	Name() string
	// Encode returns m as it must be handed to the sink. It never modifies
	// m or m.Headers (which the caller shares); it returns a message with
	// its own Headers map when it changes them. An error means m can never
	// be encoded (Wrap fails it as permanent).
	Encode(m sinks.Message) (sinks.Message, error)
}

// Format names accepted by Parse.
const (
	NameRaw         = "raw"
	NameCloudEvents = "cloudevents"
	NameDebezium    = "debezium"
)

// Names lists the formats Parse accepts, default first.
var Names = []string{NameRaw, NameCloudEvents, NameDebezium}

// Binding is a CloudEvents protocol binding: it decides the header names.
type Binding string

// Protocol bindings.
const (
	// BindingKafka: ce_<attribute> headers, datacontenttype in the
	// content-type header.
	BindingKafka Binding = "kafka"
	// BindingHTTP: ce-<attribute> headers with percent-encoded values,
	// datacontenttype in Content-Type.
	BindingHTTP Binding = "http"
	// BindingAMQP: cloudEvents_<attribute> application properties (AMQP
	// 0-9-1 headers), datacontenttype in the content-type property.
	BindingAMQP Binding = "amqp"
	// BindingNATS: the CloudEvents NATS binding's binary mode, ce-<attribute>
	// headers with values percent-encoded as in HTTP, datacontenttype in
	// the content-type header.
	BindingNATS Binding = "nats"
)

// Bindings lists the supported bindings.
var Bindings = []Binding{BindingKafka, BindingHTTP, BindingAMQP, BindingNATS}

// AMQP application-property prefixes allowed by the CloudEvents AMQP
// binding. The binding says the underscore form SHOULD be preferred (JMS
// 2.0 selectors cannot use ':'); some SDKs (sdk-go) only read the colon
// form.
const (
	AMQPPrefixUnderscore = "cloudEvents_"
	AMQPPrefixColon      = "cloudEvents:"
)

// DefaultSource is the CloudEvents source attribute when Options.Source is
// empty. Set a source that names your service (a URI reference such as
// "/orders" or "https://orders.example.com") in production.
const DefaultSource = "outbox-relay"

// Options configures Parse. Each field's zero value means its default.
type Options struct {
	// Binding selects the CloudEvents protocol binding, which decides the
	// header names: kafka, http, amqp or nats. Required for cloudevents; ignored
	// by the other formats. A sink's driver names its binding
	// (sinks.Driver.Binding).
	Binding Binding
	// Source is the CloudEvents source attribute of every event, a URI
	// reference. Default DefaultSource ("outbox-relay").
	Source string
	// AMQPPrefix is the application-property prefix of the amqp binding:
	// AMQPPrefixUnderscore ("cloudEvents_", the binding's preferred form)
	// or AMQPPrefixColon ("cloudEvents:", for consumers that only read that
	// form, such as sdk-go). Default "cloudEvents_".
	AMQPPrefix string
}

// Parse returns the format called name ("" means raw), validating opts.
func Parse(name string, opts Options) (Format, error) {
	switch name {
	case "", NameRaw:
		return Raw, nil
	case NameCloudEvents:
		return CloudEvents(opts)
	case NameDebezium:
		return Debezium, nil
	}
	return nil, fmt.Errorf("outbox: format: unknown format %q (want one of %s)", name, strings.Join(Names, ", "))
}

// Raw is the identity format: messages go out as written.
var Raw Format = raw{}

type raw struct{}

func (raw) Name() string                                  { return NameRaw }
func (raw) Encode(m sinks.Message) (sinks.Message, error) { return m, nil }

// Wrap returns a sink that encodes every message with f before inner sends
// it. Outcomes keep their indices: the i-th error of a *sinks.BatchError
// belongs to the i-th message given to Send. A message f cannot encode
// fails as permanent (it is dead-lettered) and later messages of its key
// in the same call are reported as sinks.ErrNotAttempted; the others are
// still sent. With f nil or Raw, Wrap returns inner itself.
//
// The result implements sinks.HealthChecker when inner does.
func Wrap(inner sinks.Sink, f Format) sinks.Sink {
	if f == nil || f == Raw {
		return inner
	}
	w := &wrapped{inner: inner, f: f}
	if hc, ok := inner.(sinks.HealthChecker); ok {
		return &wrappedHealth{wrapped: w, hc: hc}
	}
	return w
}

type wrapped struct {
	inner sinks.Sink
	f     Format
}

func (w *wrapped) Send(ctx context.Context, msgs []sinks.Message) error {
	out := make([]sinks.Message, len(msgs))
	var be *sinks.BatchError
	var gate sinks.KeyGate
	for i, m := range msgs {
		if gate.Blocked(m) {
			be.Errs[i] = sinks.ErrNotAttempted // be is set: a failure came first
			continue
		}
		em, err := w.f.Encode(m)
		if err != nil {
			if be == nil {
				be = sinks.NewBatchError(len(msgs))
			}
			be.Errs[i] = sinks.Permanent(fmt.Errorf("outbox: format %s: message %s: %w", w.f.Name(), m.ID, err))
			gate.Fail(m)
			continue
		}
		out[i] = em
	}
	if be == nil {
		// The common case: the inner sink's answer already has the right
		// shape and indices.
		return w.inner.Send(ctx, out)
	}
	idx := make([]int, 0, len(msgs))
	for i, err := range be.Errs {
		if err == nil {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return be
	}
	sub := make([]sinks.Message, len(idx))
	for j, i := range idx {
		sub[j] = out[i]
	}
	err := w.inner.Send(ctx, sub)
	if errors.Is(err, sinks.ErrClosed) {
		return err
	}
	for j, i := range idx {
		be.Errs[i] = sinks.Outcome(err, j, len(sub))
	}
	return be.Err()
}

func (w *wrapped) Close(ctx context.Context) error { return w.inner.Close(ctx) }

// FormatName names the format w encodes messages in (the relay's
// fingerprint of a route's configuration includes it).
func (w *wrapped) FormatName() string { return w.f.Name() }

// Unwrap returns the sink w decorates.
func (w *wrapped) Unwrap() sinks.Sink { return w.inner }

type wrappedHealth struct {
	*wrapped
	hc sinks.HealthChecker
}

func (w *wrappedHealth) Healthy(ctx context.Context) error { return w.hc.Healthy(ctx) }

// validSource reports whether s is a non-empty URI reference.
func validSource(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if _, err := url.Parse(s); err != nil {
		return fmt.Errorf("%q is not a URI reference", s)
	}
	for _, r := range s {
		if r < 0x21 || r == 0x7f {
			return fmt.Errorf("%q contains spaces or control characters (percent-encode them)", s)
		}
	}
	return nil
}
