package format_test

// End to end: the formats wrapped around the real sinks, checked on what a
// real consumer of each backend receives (a franz-go consumer on kfake, a
// net/http server, an amqp091 consumer on the local RabbitMQ).

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
	"github.com/outbox-relay/outbox-relay/sinks/format"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func closeSink(t *testing.T, s sinks.Sink) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Close(ctx))
	})
}

// e2eMessages: a full message, a minimal one, and one with non-ASCII text.
func e2eMessages(topic string) []sinks.Message {
	full := sample()
	full.Topic = topic
	minimal := sample()
	minimal.ID = "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f51"
	minimal.Topic = topic
	minimal.Key = ""
	minimal.Headers = nil
	minimal.Payload = []byte{0, 1, 2, 0xff}
	uni := sample()
	uni.ID = "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f52"
	uni.Topic = topic
	uni.Key = "clé €"
	uni.Headers = map[string]string{"type": "commande.créée"}
	return []sinks.Message{full, minimal, uni}
}

// wantAttrs is what a receiver must decode from e2eMessages.
func wantAttrs(topic, source string) []map[string]string {
	return []map[string]string{
		{"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", "source": source, "outboxseq": "7",
			"type": "com.example.order.created", "time": createdUTC, "subject": "order-42",
			"partitionkey": "order-42", "datacontenttype": "application/json"},
		{"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f51", "source": source, "outboxseq": "7",
			"type": topic, "time": createdUTC},
		{"specversion": "1.0", "id": "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f52", "source": source, "outboxseq": "7",
			"type": "commande.créée", "time": createdUTC, "subject": "clé €", "partitionkey": "clé €"},
	}
}

func byID(evs []event) []event {
	sort.Slice(evs, func(i, j int) bool { return evs[i].attrs["id"] < evs[j].attrs["id"] })
	return evs
}

// --- Kafka -----------------------------------------------------------------

func kafkaSetup(t *testing.T, topic string) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		pgtest.Unavailable(t, "kfake cannot listen on loopback: %v", err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return c, cl
}

func kafkaRead(t *testing.T, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollRecords(ctx, n-len(out))
		require.NoError(t, ctx.Err(), "read %d of %d records", len(out), n)
		for _, e := range fs.Errors() {
			require.NoError(t, e.Err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func recordHeaders(r *kgo.Record) []header {
	var hs []header
	for _, h := range r.Headers {
		hs = append(hs, header{h.Key, string(h.Value)})
	}
	return hs
}

func headerNames(hs []header) []string {
	var names []string
	for _, h := range hs {
		names = append(names, h.name)
	}
	sort.Strings(names)
	return names
}

func TestE2EKafkaCloudEvents(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	c, cl := kafkaSetup(t, topic)
	ks, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), WriteTimeout: 10 * time.Second}, testkit.Logger(t, slog.LevelInfo))
	require.NoError(t, err)
	s := format.Wrap(ks, mustCE(t, format.Options{Binding: format.BindingKafka, Source: "/svc/orders"}))
	closeSink(t, s)
	_, ok := s.(sinks.HealthChecker)
	require.True(t, ok, "the Kafka sink's health check must survive wrapping")

	msgs := e2eMessages(topic)
	require.NoError(t, s.Send(ctxFor(t, 20*time.Second), msgs))
	recs := kafkaRead(t, cl, len(msgs))

	var evs []event
	for _, r := range recs {
		hs := recordHeaders(r)
		ev, err := decodeKafka(hs, r.Value)
		require.NoError(t, err, "record headers %v", hs)
		evs = append(evs, ev)
		id := ev.attrs["id"]
		i := slices.IndexFunc(msgs, func(m sinks.Message) bool { return m.ID == id })
		require.GreaterOrEqual(t, i, 0)
		m := msgs[i]
		require.Equal(t, m.Payload, r.Value, "payload byte for byte")
		if m.Key == "" {
			require.Nil(t, r.Key)
		} else {
			require.Equal(t, m.Key, string(r.Key), "the record key stays the outbox key")
		}
		// Exact header names on the wire.
		want := []string{"ce_id", "ce_outboxseq", "ce_source", "ce_specversion", "ce_time", "ce_type", kafkasink.HeaderMessageID, kafkasink.HeaderSeq}
		if m.Key != "" {
			want = append(want, "ce_partitionkey", "ce_subject")
		}
		for k := range m.Headers {
			want = append(want, k)
		}
		sort.Strings(want)
		require.Equal(t, want, headerNames(hs), "message %s", id)
	}
	evs = byID(evs)
	for i, w := range wantAttrs(topic, "/svc/orders") {
		require.Equal(t, w, evs[i].attrs)
	}
}

func TestE2EKafkaDebezium(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.Order"
	c, cl := kafkaSetup(t, topic)
	ks, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), WriteTimeout: 10 * time.Second}, testkit.Logger(t, slog.LevelInfo))
	require.NoError(t, err)
	s := format.Wrap(ks, format.Debezium)
	closeSink(t, s)

	m := sample()
	m.Topic = topic
	m.Key = "1" // Debezium's aggregateid
	m.Headers = map[string]string{"eventType": "OrderCreated"}
	require.NoError(t, s.Send(ctxFor(t, 20*time.Second), []sinks.Message{m}))
	r := kafkaRead(t, cl, 1)[0]
	require.Equal(t, topic, r.Topic)
	require.Equal(t, "1", string(r.Key))
	require.Equal(t, m.Payload, r.Value)
	got := map[string]string{}
	for _, h := range recordHeaders(r) {
		require.NotContains(t, got, h.name, "header %q twice", h.name)
		got[h.name] = h.value
	}
	require.Equal(t, map[string]string{
		"id":                      m.ID,
		"eventType":               "OrderCreated",
		kafkasink.HeaderMessageID: m.ID,
		kafkasink.HeaderSeq:       "7",
	}, got)
}

// --- HTTP ------------------------------------------------------------------

type request struct {
	header http.Header
	body   []byte
}

func httpReceiver(t *testing.T) (*httptest.Server, func() []request) {
	var mu sync.Mutex
	var got []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, request{r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []request {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func TestE2EHTTPCloudEvents(t *testing.T) {
	t.Parallel()
	srv, received := httpReceiver(t)
	hs, err := httpsink.New(httpsink.Config{URL: srv.URL + "/events"}, testkit.Logger(t, slog.LevelInfo))
	require.NoError(t, err)
	s := format.Wrap(hs, mustCE(t, format.Options{Binding: format.BindingHTTP, Source: "/svc/orders"}))
	closeSink(t, s)

	msgs := e2eMessages("orders")
	require.NoError(t, s.Send(ctxFor(t, 20*time.Second), msgs))
	reqs := received()
	require.Len(t, reqs, len(msgs))

	var evs []event
	for _, r := range reqs {
		ev, err := decodeHTTP(r.header, r.body)
		require.NoError(t, err, "request headers %v", r.header)
		evs = append(evs, ev)
		var ce []string
		for k := range r.header {
			if strings.HasPrefix(strings.ToLower(k), "ce-") {
				ce = append(ce, strings.ToLower(k))
			}
		}
		sort.Strings(ce)
		want := []string{"ce-id", "ce-outboxseq", "ce-source", "ce-specversion", "ce-time", "ce-type"}
		if ev.attrs["subject"] != "" {
			want = []string{"ce-id", "ce-outboxseq", "ce-partitionkey", "ce-source", "ce-specversion", "ce-subject", "ce-time", "ce-type"}
		}
		require.Equal(t, want, ce)
		// The sink's own headers are still there.
		require.Equal(t, ev.attrs["id"], r.header.Get(httpsink.HeaderWebhookID))
	}
	evs = byID(evs)
	want := wantAttrs("orders", "/svc/orders")
	// Without a content-type header of its own, a request carries the
	// sink's default Content-Type, which a receiver reads as
	// datacontenttype.
	want[1]["datacontenttype"] = httpsink.DefaultContentType
	want[2]["datacontenttype"] = httpsink.DefaultContentType
	for i, w := range want {
		require.Equal(t, w, evs[i].attrs)
		require.Equal(t, byIDMsg(msgs, w["id"]).Payload, evs[i].data)
	}
	// On the wire the non-ASCII subject is percent-encoded.
	for _, r := range reqs {
		if r.header.Get("ce-id") == "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f52" {
			require.Equal(t, "cl%C3%A9%20%E2%82%AC", r.header.Get("ce-subject"))
			require.Equal(t, "commande.cr%C3%A9%C3%A9e", r.header.Get("ce-type"))
		}
	}
}

func byIDMsg(msgs []sinks.Message, id string) sinks.Message {
	for _, m := range msgs {
		if m.ID == id {
			return m
		}
	}
	return sinks.Message{}
}

// --- AMQP ------------------------------------------------------------------

// amqpSetup declares a throwaway exchange and queue bound for topic and
// returns the consumer's deliveries.
func amqpSetup(t *testing.T, topic string) (exchange string, deliv <-chan amqp.Delivery) {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		pgtest.Unavailable(t, "RabbitMQ not reachable at TEST_AMQP_URL: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	exchange, queue := testkit.RandName("outbox-format-x"), testkit.RandName("outbox-format-q")
	require.NoError(t, ch.ExchangeDeclare(exchange, "direct", false, true, false, false, nil))
	_, err = ch.QueueDeclare(queue, false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue, topic, exchange, false, nil))
	deliv, err = ch.Consume(queue, "", true, true, false, false, nil)
	require.NoError(t, err)
	return exchange, deliv
}

func amqpRead(t *testing.T, deliv <-chan amqp.Delivery, n int) []amqp.Delivery {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	var out []amqp.Delivery
	for len(out) < n {
		select {
		case d, ok := <-deliv:
			require.True(t, ok, "consumer closed after %d of %d", len(out), n)
			out = append(out, d)
		case <-ctx.Done():
			t.Fatalf("received %d of %d messages", len(out), n)
		}
	}
	return out
}

func TestE2EAMQPCloudEvents(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{format.AMQPPrefixUnderscore, format.AMQPPrefixColon} {
		t.Run(prefix, func(t *testing.T) {
			t.Parallel()
			const topic = "orders"
			exchange, deliv := amqpSetup(t, topic)
			as, err := amqpsink.New(amqpsink.Config{URL: testkit.AMQPURL(), Exchange: exchange, PublishTimeout: 10 * time.Second}, testkit.Logger(t, slog.LevelInfo))
			require.NoError(t, err)
			s := format.Wrap(as, mustCE(t, format.Options{Binding: format.BindingAMQP, Source: "/svc/orders", AMQPPrefix: prefix}))
			closeSink(t, s)

			msgs := e2eMessages(topic)
			require.NoError(t, s.Send(ctxFor(t, 20*time.Second), msgs))
			ds := amqpRead(t, deliv, len(msgs))
			var evs []event
			for _, d := range ds {
				props := map[string]any(d.Headers)
				ev, err := decodeAMQP(props, d.ContentType, d.Body)
				require.NoError(t, err, "headers %v content-type %q", d.Headers, d.ContentType)
				evs = append(evs, ev)
				require.Equal(t, ev.attrs["id"], d.MessageId)
				var ce []string
				for k := range d.Headers {
					if strings.HasPrefix(k, "cloudEvents") {
						ce = append(ce, k)
					}
				}
				sort.Strings(ce)
				want := []string{"id", "outboxseq", "source", "specversion", "time", "type"}
				if ev.attrs["subject"] != "" {
					want = []string{"id", "outboxseq", "partitionkey", "source", "specversion", "subject", "time", "type"}
				}
				for i := range want {
					want[i] = prefix + want[i]
				}
				require.Equal(t, want, ce, "exact application-property names")
			}
			evs = byID(evs)
			want := wantAttrs(topic, "/svc/orders")
			// Without a content-type header the sink's default content-type
			// property applies.
			want[1]["datacontenttype"] = "application/octet-stream"
			want[2]["datacontenttype"] = "application/octet-stream"
			for i, w := range want {
				require.Equal(t, w, evs[i].attrs)
				require.Equal(t, byIDMsg(msgs, w["id"]).Payload, evs[i].data)
			}
		})
	}
}
