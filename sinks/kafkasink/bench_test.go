package kafkasink

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend publishes batches of 500 messages of 200 bytes to a
// 1-broker kfake cluster with 8 partitions, in two shapes: keys spread over
// 1,000 (what a breadth-first claim takes) and 5 keys (what the
// lane-local claim took from a 1,000-key backlog: few partitions per
// produce request).
func BenchmarkSend(b *testing.B) {
	c := newCluster(b, kfake.SeedTopics(8, "bench"))
	s := newSink(b, c)
	payload := make([]byte, 200)
	for _, keys := range []int{1000, 5} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			msgs := make([]sinks.Message, 500)
			for i := range msgs {
				msgs[i] = sinktest.Msg("bench", fmt.Sprintf("key-%d", i*7%keys), int64(i), payload)
				msgs[i].Headers = map[string]string{"content-type": "application/json"}
			}
			ctx := context.Background()
			if err := s.Send(ctx, msgs); err != nil { // warm connections and metadata
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := s.Send(ctx, msgs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
