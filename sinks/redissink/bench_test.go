package redissink

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend is one Send of 500 messages (1,000 keys' worth of
// interleaving: 4 keys, as a lane-local batch holds) against the same
// 500 XADDs in one raw go-redis pipeline, on the shared server. Compare
// the two in one run (-bench . -count 5, alternating by benchstat).
func BenchmarkSend(b *testing.B) {
	e := setup(b, direct(), withConfig(func(c *Config) { c.Stream = "{topic}" }))
	ctx := context.Background()
	topic := e.topic("bench")
	batch := sinktest.Batch(topic, 500, 4, 200)
	b.Run("sink", func(b *testing.B) {
		for b.Loop() {
			if err := e.sink.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
	b.Run("raw-pipeline", func(b *testing.B) {
		for b.Loop() {
			p := e.rdb.Pipeline()
			for _, m := range batch {
				p.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"id", m.ID, "key", m.Key, "payload", m.Payload}})
			}
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
}
