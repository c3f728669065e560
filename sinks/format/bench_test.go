package format_test

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// BenchmarkEncode measures the per-message cost of each format.
func BenchmarkEncode(b *testing.B) {
	ce := func(bd format.Binding) format.Format {
		f, err := format.Parse(format.NameCloudEvents, format.Options{Binding: bd})
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name string
		f    format.Format
	}{
		{"cloudevents-kafka", ce(format.BindingKafka)},
		{"cloudevents-http", ce(format.BindingHTTP)},
		{"cloudevents-amqp", ce(format.BindingAMQP)},
		{"debezium", format.Debezium},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m := sample()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.f.Encode(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWrapBatch measures a 500-message Send through Wrap into a sink
// that does nothing, per message.
func BenchmarkWrapBatch(b *testing.B) {
	d, err := discard.New(discard.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := format.Parse(format.NameCloudEvents, format.Options{Binding: format.BindingKafka})
	if err != nil {
		b.Fatal(err)
	}
	s := format.Wrap(d, f)
	msgs := make([]sinks.Message, 500)
	for i := range msgs {
		msgs[i] = sample()
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Send(context.Background(), msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
}
