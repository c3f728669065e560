package format_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

var created = time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.FixedZone("CEST", 2*3600))

const createdUTC = "2024-05-06T05:08:09.123456Z"

func sample() sinks.Message {
	return sinks.Message{
		ID:      "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50",
		Seq:     7,
		Topic:   "orders",
		Key:     "order-42",
		Payload: []byte(`{"total":12}`),
		Headers: map[string]string{
			"type":         "com.example.order.created",
			"content-type": "application/json",
			"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"x-tenant":     "acme",
		},
		CreatedAt: created,
		Attempt:   1,
	}
}

func mustCE(t *testing.T, opts format.Options) format.Format {
	t.Helper()
	f, err := format.Parse(format.NameCloudEvents, opts)
	require.NoError(t, err)
	return f
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "raw"} {
		f, err := format.Parse(name, format.Options{})
		require.NoError(t, err)
		require.Equal(t, format.Raw, f)
	}
	f, err := format.Parse("debezium", format.Options{})
	require.NoError(t, err)
	require.Equal(t, "debezium", f.Name())
	for _, b := range format.Bindings {
		f, err := format.Parse("cloudevents", format.Options{Binding: b})
		require.NoError(t, err)
		require.Equal(t, "cloudevents", f.Name())
	}

	bad := []struct {
		name string
		opts format.Options
		want string
	}{
		{"json", format.Options{}, `unknown format "json"`},
		{"CloudEvents", format.Options{Binding: format.BindingKafka}, "unknown format"},
		{"cloudevents", format.Options{}, "binding: required"},
		{"cloudevents", format.Options{Binding: "mqtt"}, `binding: unknown binding "mqtt"`},
		{"cloudevents", format.Options{Binding: format.BindingKafka, Source: "has space"}, "cloudevents-source"},
		{"cloudevents", format.Options{Binding: format.BindingKafka, Source: "/a\nb"}, "cloudevents-source"},
		{"cloudevents", format.Options{Binding: format.BindingAMQP, AMQPPrefix: "ce_"}, "cloudevents-amqp-prefix"},
	}
	for _, tc := range bad {
		_, err := format.Parse(tc.name, tc.opts)
		require.ErrorContains(t, err, tc.want, "%s %+v", tc.name, tc.opts)
		require.ErrorContains(t, err, "outbox: format")
	}
}

// TestCloudEventsHeaders pins the exact headers of each binding.
func TestCloudEventsHeaders(t *testing.T) {
	t.Parallel()
	app := map[string]string{
		"type":        "com.example.order.created",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-tenant":    "acme",
	}
	with := func(extra map[string]string) map[string]string {
		m := maps.Clone(app)
		maps.Copy(m, extra)
		return m
	}
	cases := []struct {
		name string
		opts format.Options
		want map[string]string
	}{
		{"kafka", format.Options{Binding: format.BindingKafka}, with(map[string]string{
			"ce_specversion":  "1.0",
			"ce_id":           "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50",
			"ce_source":       "outbox-relay",
			"ce_type":         "com.example.order.created",
			"ce_time":         createdUTC,
			"ce_subject":      "order-42",
			"ce_partitionkey": "order-42",
			"ce_outboxseq":    "7",
			"content-type":    "application/json",
		})},
		{"http", format.Options{Binding: format.BindingHTTP, Source: "/orders"}, with(map[string]string{
			"ce-specversion":  "1.0",
			"ce-id":           "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50",
			"ce-source":       "/orders",
			"ce-type":         "com.example.order.created",
			"ce-time":         createdUTC,
			"ce-subject":      "order-42",
			"ce-partitionkey": "order-42",
			"ce-outboxseq":    "7",
			"content-type":    "application/json",
		})},
		{"amqp", format.Options{Binding: format.BindingAMQP, Source: "https://orders.example.com"}, with(map[string]string{
			"cloudEvents_specversion":  "1.0",
			"cloudEvents_id":           "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50",
			"cloudEvents_source":       "https://orders.example.com",
			"cloudEvents_type":         "com.example.order.created",
			"cloudEvents_time":         createdUTC,
			"cloudEvents_subject":      "order-42",
			"cloudEvents_partitionkey": "order-42",
			"cloudEvents_outboxseq":    "7",
			"content-type":             "application/json",
		})},
		{"amqp-colon", format.Options{Binding: format.BindingAMQP, AMQPPrefix: format.AMQPPrefixColon}, with(map[string]string{
			"cloudEvents:specversion":  "1.0",
			"cloudEvents:id":           "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50",
			"cloudEvents:source":       "outbox-relay",
			"cloudEvents:type":         "com.example.order.created",
			"cloudEvents:time":         createdUTC,
			"cloudEvents:subject":      "order-42",
			"cloudEvents:partitionkey": "order-42",
			"cloudEvents:outboxseq":    "7",
			"content-type":             "application/json",
		})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := mustCE(t, tc.opts)
			in := sample()
			before := maps.Clone(in.Headers)
			out, err := f.Encode(in)
			require.NoError(t, err)
			require.Equal(t, tc.want, out.Headers)
			require.Equal(t, before, in.Headers, "Encode must not modify the caller's headers")
			require.Equal(t, in.Key, out.Key)
			require.Equal(t, in.Topic, out.Topic)
			require.Equal(t, in.ID, out.ID)
			require.Equal(t, in.Payload, out.Payload)
		})
	}
}

// TestCloudEventsDecode decodes each binding's output with the binding's
// receiver rules and checks every attribute.
func TestCloudEventsDecode(t *testing.T) {
	t.Parallel()
	type decoder func(h map[string]string, body []byte) (event, error)
	bindings := map[format.Binding]decoder{
		format.BindingKafka: func(h map[string]string, b []byte) (event, error) { return decodeKafka(kafkaHeaders(h), b) },
		format.BindingHTTP:  func(h map[string]string, b []byte) (event, error) { return decodeHTTP(httpHeader(h), b) },
		// The NATS binding's binary mode takes HTTP's header rules.
		format.BindingNATS: func(h map[string]string, b []byte) (event, error) { return decodeHTTP(httpHeader(h), b) },
		format.BindingAMQP: func(h map[string]string, b []byte) (event, error) {
			p, ct := amqpProps(h)
			return decodeAMQP(p, ct, b)
		},
	}
	msgs := []struct {
		name string
		mod  func(*sinks.Message)
		want map[string]string
	}{
		{"full", func(*sinks.Message) {}, map[string]string{
			"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", "source": "/svc/orders", "outboxseq": "7",
			"type": "com.example.order.created", "time": createdUTC, "subject": "order-42",
			"partitionkey": "order-42", "datacontenttype": "application/json",
		}},
		{"minimal: no key, no type, no content type, no time", func(m *sinks.Message) {
			m.Key = ""
			m.Headers = nil
			m.CreatedAt = time.Time{}
		}, map[string]string{
			"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", "source": "/svc/orders", "outboxseq": "7", "type": "orders",
		}},
		{"application headers that collide are replaced", func(m *sinks.Message) {
			m.Headers = map[string]string{
				"ce_id": "forged", "ce-id": "forged", "Ce-Source": "forged", "cloudEvents_id": "forged",
				"cloudEvents:type": "forged", "ce_datacontenttype": "text/plain", "ce-datacontenttype": "text/plain",
				"cloudEvents_datacontenttype": "text/plain", "CE_SPECVERSION": "0.3",
				"Content-Type": "application/xml",
			}
		}, map[string]string{
			"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", "source": "/svc/orders", "outboxseq": "7",
			"type": "orders", "time": createdUTC, "subject": "order-42", "partitionkey": "order-42",
			"datacontenttype": "application/xml",
		}},
		{"unicode key and type", func(m *sinks.Message) {
			m.Key = `Euro € 😀 "q" 100%`
			m.Headers = map[string]string{"type": "événement créé"}
		}, map[string]string{
			"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", "source": "/svc/orders", "outboxseq": "7",
			"type": "événement créé", "time": createdUTC, "subject": `Euro € 😀 "q" 100%`,
			"partitionkey": `Euro € 😀 "q" 100%`,
		}},
	}
	for b, decode := range bindings {
		f := mustCE(t, format.Options{Binding: b, Source: "/svc/orders"})
		for _, tc := range msgs {
			t.Run(string(b)+"/"+tc.name, func(t *testing.T) {
				m := sample()
				tc.mod(&m)
				out, err := f.Encode(m)
				require.NoError(t, err)
				ev, err := decode(out.Headers, out.Payload)
				require.NoError(t, err, "headers %v", out.Headers)
				require.Equal(t, tc.want, ev.attrs)
				require.Equal(t, m.Payload, ev.data)
			})
		}
	}
}

func TestHTTPPercentEncoding(t *testing.T) {
	t.Parallel()
	f := mustCE(t, format.Options{Binding: format.BindingHTTP})
	m := sample()
	m.Key = "Euro € 😀" // the binding specification's own example
	out, err := f.Encode(m)
	require.NoError(t, err)
	require.Equal(t, "Euro%20%E2%82%AC%20%F0%9F%98%80", out.Headers["ce-subject"])

	m.Key = `a"b%c` + "\x7f\t"
	out, err = f.Encode(m)
	require.NoError(t, err)
	require.Equal(t, "a%22b%25c%7F%09", out.Headers["ce-subject"])
	// Kafka and AMQP carry UTF-8 as is.
	for _, b := range []format.Binding{format.BindingKafka, format.BindingAMQP} {
		out, err := mustCE(t, format.Options{Binding: b}).Encode(sample())
		require.NoError(t, err)
		for k, v := range out.Headers {
			require.NotContains(t, v, "%", "%s: %s", b, k)
		}
	}
}

func FuzzHTTPPercentEncoding(f *testing.F) {
	for _, s := range []string{"", "order-42", "Euro € 😀", `"%"`, "\x00\x1f\x7f", "\xff"} {
		f.Add(s)
	}
	ce, err := format.Parse(format.NameCloudEvents, format.Options{Binding: format.BindingHTTP})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, key string) {
		m := sample()
		m.Key = key
		out, err := ce.Encode(m)
		require.NoError(t, err)
		v, ok := out.Headers["ce-subject"]
		if key == "" {
			require.False(t, ok)
			return
		}
		for i := 0; i < len(v); i++ {
			require.True(t, v[i] >= 0x21 && v[i] <= 0x7e && v[i] != '"', "byte %#x left unencoded in %q", v[i], v)
		}
		got, err := httpAttrValue(v)
		if err != nil {
			// Only input that is not UTF-8 may fail to decode, and then the
			// decoder must notice.
			require.False(t, utf8.ValidString(key), "valid key %q failed: %v", key, err)
			return
		}
		require.Equal(t, key, got)
	})
}

func TestCloudEventsErrors(t *testing.T) {
	t.Parallel()
	f := mustCE(t, format.Options{Binding: format.BindingKafka})
	m := sample()
	m.ID = ""
	_, err := f.Encode(m)
	require.ErrorContains(t, err, "id")
	m = sample()
	m.Topic = ""
	delete(m.Headers, "type")
	_, err = f.Encode(m)
	require.ErrorContains(t, err, "type")
	// An empty type header falls back to the topic.
	m = sample()
	m.Headers["type"] = ""
	out, err := f.Encode(m)
	require.NoError(t, err)
	require.Equal(t, "orders", out.Headers["ce_type"])
}

func TestDebezium(t *testing.T) {
	t.Parallel()
	f, err := format.Parse("debezium", format.Options{})
	require.NoError(t, err)
	in := sample()
	in.Headers["id"] = "forged"
	in.Headers["eventType"] = "OrderCreated"
	before := maps.Clone(in.Headers)
	out, err := f.Encode(in)
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"id":           in.ID,
		"type":         "com.example.order.created",
		"content-type": "application/json",
		"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-tenant":     "acme",
		"eventType":    "OrderCreated",
	}, out.Headers)
	require.Equal(t, before, in.Headers)
	require.Equal(t, in.Key, out.Key)
	require.Equal(t, in.Topic, out.Topic)
	require.Equal(t, in.Payload, out.Payload)

	in = sample()
	in.Headers = nil
	out, err = f.Encode(in)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"id": in.ID}, out.Headers)
}

func TestWrapRawIsIdentity(t *testing.T) {
	t.Parallel()
	inner := memory.New()
	require.Same(t, sinks.Sink(inner), format.Wrap(inner, format.Raw))
	require.Same(t, sinks.Sink(inner), format.Wrap(inner, nil))
}

type healthySink struct {
	*memory.Sink
	err error
}

func (h healthySink) Healthy(context.Context) error { return h.err }

func TestWrapHealthChecker(t *testing.T) {
	t.Parallel()
	w := format.Wrap(memory.New(), format.Debezium)
	_, ok := w.(sinks.HealthChecker)
	require.False(t, ok, "a sink without health checks must not gain one")

	boom := errors.New("broker down")
	w = format.Wrap(healthySink{memory.New(), boom}, format.Debezium)
	hc, ok := w.(sinks.HealthChecker)
	require.True(t, ok)
	require.ErrorIs(t, hc.Healthy(context.Background()), boom)
}

func batch() []sinks.Message {
	var msgs []sinks.Message
	for i, k := range []string{"a", "b", "a", "c", "", "b"} {
		m := sample()
		m.ID = "id-" + string(rune('0'+i))
		m.Seq = int64(i + 1)
		m.Key = k
		msgs = append(msgs, m)
	}
	return msgs
}

// TestWrapSendsFormattedOneToOne: every message reaches the inner sink
// encoded, in order, and the inner sink's per-message errors come back at
// the same indices.
func TestWrapSendsFormattedOneToOne(t *testing.T) {
	t.Parallel()
	inner := memory.New()
	boom := errors.New("boom")
	inner.SetFail(func(m sinks.Message) error {
		if m.ID == "id-1" { // key b
			return boom
		}
		return nil
	})
	w := format.Wrap(inner, mustCE(t, format.Options{Binding: format.BindingKafka}))
	msgs := batch()
	err := w.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, len(msgs))
	require.ErrorIs(t, be.Errs[1], boom)
	require.ErrorIs(t, be.Errs[5], sinks.ErrNotAttempted) // later message of key b
	for _, i := range []int{0, 2, 3, 4} {
		require.NoError(t, be.Errs[i], i)
	}
	got := inner.Delivered()
	require.Len(t, got, 4)
	for i, m := range got {
		require.Equal(t, []string{"id-0", "id-2", "id-3", "id-4"}[i], m.ID)
		require.Equal(t, m.ID, m.Headers["ce_id"])
	}
	require.Empty(t, inner.Violations())
}

// TestWrapEncodeFailure: a message the format cannot encode fails as
// permanent at its own index, later messages of its key are not
// attempted, and the rest are still sent with their outcomes mapped back.
func TestWrapEncodeFailure(t *testing.T) {
	t.Parallel()
	inner := memory.New()
	boom := errors.New("boom")
	inner.SetFail(func(m sinks.Message) error {
		if m.ID == "id-3" { // key c
			return boom
		}
		return nil
	})
	w := format.Wrap(inner, mustCE(t, format.Options{Binding: format.BindingHTTP}))
	msgs := batch()
	msgs[0].ID = "" // key a: cannot be a CloudEvent
	err := w.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, len(msgs))
	require.True(t, sinks.IsPermanent(be.Errs[0]), "%v", be.Errs[0])
	require.ErrorContains(t, be.Errs[0], "format cloudevents")
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted) // key a after the failure
	require.ErrorIs(t, be.Errs[3], boom)                  // inner failure, mapped back
	require.False(t, sinks.IsPermanent(be.Errs[3]))
	for _, i := range []int{1, 4, 5} {
		require.NoError(t, be.Errs[i], i)
	}
	var ids []string
	for _, m := range inner.Delivered() {
		ids = append(ids, m.ID)
		require.Equal(t, m.ID, m.Headers["ce-id"])
	}
	require.Equal(t, []string{"id-1", "id-4", "id-5"}, ids)

	// Every message unencodable: nothing reaches the sink.
	before := inner.Sends()
	one := batch()[:1]
	one[0].ID = ""
	err = w.Send(context.Background(), one)
	require.ErrorAs(t, err, &be)
	require.True(t, sinks.IsPermanent(be.Errs[0]))
	require.Equal(t, before, inner.Sends())
}

// TestWrapWholeBatchError: an inner error that is not a BatchError applies
// to every message the inner sink was given, and only to them.
func TestWrapWholeBatchError(t *testing.T) {
	t.Parallel()
	inner := memory.New()
	w := format.Wrap(inner, format.Debezium)
	require.NoError(t, w.Close(context.Background()))
	err := w.Send(context.Background(), batch())
	require.ErrorIs(t, err, sinks.ErrClosed)

	inner = memory.New()
	w = format.Wrap(inner, mustCE(t, format.Options{Binding: format.BindingKafka}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := batch()
	msgs[3].ID = ""
	err = w.Send(ctx, msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.True(t, sinks.IsPermanent(be.Errs[3]))
	for _, i := range []int{0, 1, 2, 4, 5} {
		require.ErrorIs(t, be.Errs[i], context.Canceled, i)
	}
}

type keySerialSink struct{ sinks.Sink }

func (keySerialSink) KeySerial() bool { return true }

// A format keeps what the relay asks of the sink underneath: whether it
// sends a key's messages one round trip after another.
func TestWrapKeepsKeySerial(t *testing.T) {
	ce, err := format.CloudEvents(format.Options{Binding: format.BindingHTTP})
	require.NoError(t, err)
	inner := keySerialSink{memory.New()}
	require.True(t, sinks.IsKeySerial(inner))
	require.True(t, sinks.IsKeySerial(format.Wrap(inner, ce)))
	require.False(t, sinks.IsKeySerial(format.Wrap(memory.New(), ce)))
}

type startCheckSink struct{ sinks.Sink }

func (startCheckSink) CheckStart(context.Context) error { return errors.New("refused") }

// The relay's start-up check reaches the sink under a format.
func TestWrapKeepsStartChecker(t *testing.T) {
	ce, err := format.CloudEvents(format.Options{Binding: format.BindingAMQP})
	require.NoError(t, err)
	sc, ok := sinks.As[sinks.StartChecker](format.Wrap(startCheckSink{memory.New()}, ce))
	require.True(t, ok)
	require.EqualError(t, sc.CheckStart(context.Background()), "refused")
	_, ok = sinks.As[sinks.StartChecker](format.Wrap(memory.New(), ce))
	require.False(t, ok)
}
