package kafkasink

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend publishes batches of 500 messages of 200 bytes to a
// 1-broker kfake cluster with 8 partitions, in two shapes: keys spread over
// 1,000 (what a breadth-first claim takes) and 5 keys (what the
// lane-local claim took from a 1,000-key backlog: few partitions per
// produce request); with the idempotent producer on and off; and from
// one sender or four at once with disjoint keys (the relay's workers),
// whose requests to a partition the idempotent producer sends one at a
// time.
func BenchmarkSend(b *testing.B) {
	c := newCluster(b, kfake.SeedTopics(8, "bench"))
	payload := make([]byte, 200)
	for _, idempotent := range []bool{true, false} {
		s := newSink(b, c, func(cfg *Config) { cfg.Idempotent = &idempotent })
		for _, senders := range []int{1, 4} {
			for _, keys := range []int{1000, 5} {
				b.Run(fmt.Sprintf("idempotent=%t/senders=%d/keys=%d", idempotent, senders, keys), func(b *testing.B) {
					batches := make([][]sinks.Message, senders)
					for g := range batches {
						batches[g] = make([]sinks.Message, 500)
						for i := range batches[g] {
							batches[g][i] = sinktest.Msg("bench", fmt.Sprintf("s%d-key-%d", g, i*7%keys), int64(i), payload)
							batches[g][i].Headers = map[string]string{"content-type": "application/json"}
						}
					}
					send := func() {
						var wg sync.WaitGroup
						for _, batch := range batches {
							wg.Go(func() {
								if err := s.Send(context.Background(), batch); err != nil {
									b.Error(err)
								}
							})
						}
						wg.Wait()
					}
					send() // warm connections, metadata and the producer id
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						send()
					}
					b.ReportMetric(float64(b.N*senders*500)/b.Elapsed().Seconds(), "msgs/s")
				})
			}
		}
	}
}
