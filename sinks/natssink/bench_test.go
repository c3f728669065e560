package natssink

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend is one Send of 500 messages over 4 keys (a lane-local
// batch) in each ordering mode, against the same 500 messages published
// by a raw nats.go async publisher, on the shared server. The sink
// connects straight to the server, as the raw publisher does.
func BenchmarkSend(b *testing.B) {
	for _, ordering := range []string{OrderingStrict, OrderingPipelined} {
		b.Run("sink-"+ordering, func(b *testing.B) {
			e := setup(b, direct(), withConfig(func(c *Config) { c.Ordering = ordering; c.Subject = "{topic}" }))
			ctx := context.Background()
			batch := sinktest.Batch(e.topic("bench"), 500, 4, 200)
			for b.Loop() {
				if err := e.sink.Send(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
		})
	}
	b.Run("raw-async", func(b *testing.B) {
		e := setup(b)
		batch := sinktest.Batch(e.topic("bench"), 500, 4, 200)
		for b.Loop() {
			for _, m := range batch {
				nm := &nats.Msg{Subject: m.Topic, Data: m.Payload, Header: nats.Header{HeaderMsgID: {m.ID}, HeaderKey: {m.Key}}}
				if _, err := e.js.PublishMsgAsync(nm); err != nil {
					b.Fatal(err)
				}
			}
			<-e.js.PublishAsyncComplete()
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
}
