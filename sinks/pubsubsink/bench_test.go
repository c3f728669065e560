package pubsubsink

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend is one Send of 500 messages over 100 keys into pstest
// (straight, no proxy), against the same 500 messages through a raw
// publisher of the same library with message ordering on, published at
// once and waited for, with the same attributes. pstest, in the benchmark's own process, bounds
// both. Compare the two in one run (-bench . -count 5).
func BenchmarkSend(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	topic := e.topic("bench")
	direct, err := New(Config{Project: project, Topic: "{topic}", Endpoint: e.srv.Addr, Insecure: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close(ctx)
	batch := make([]sinks.Message, 500)
	for i := range batch {
		batch[i] = sinktest.Msg(topic, fmt.Sprintf("k%d", i%100), int64(i+1), make([]byte, 200))
	}
	b.Run("sink", func(b *testing.B) {
		for b.Loop() {
			if err := direct.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
	client, err := pubsub.NewClient(ctx, project, option.WithEndpoint(e.srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	p := client.Publisher(topic)
	p.EnableMessageOrdering = true
	p.PublishSettings.DelayThreshold = direct.publisher(topic).PublishSettings.DelayThreshold
	defer p.Stop()
	b.Run("raw-publisher", func(b *testing.B) {
		res := make([]*pubsub.PublishResult, len(batch))
		for b.Loop() {
			for i, m := range batch {
				res[i] = p.Publish(ctx, &pubsub.Message{Data: m.Payload, OrderingKey: m.Key,
					Attributes: map[string]string{AttrID: m.ID, AttrSeq: strconv.FormatInt(m.Seq, 10), AttrKey: m.Key}})
			}
			for _, r := range res {
				if _, err := r.Get(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
}
