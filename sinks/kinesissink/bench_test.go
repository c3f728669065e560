package kinesissink

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// BenchmarkSend is one Send of 500 messages spread over 100 keys (a wide
// batch, as the relay claims for a KeySerial sink) into a stream of 4
// shards on kinesalite, raw records, against the same 500 records as one
// raw PutRecords request of the same SDK, with no per-key rounds (the
// sink sends 5 requests, one per round, since each key has 5 messages).
// Compare the two in one run (-bench . -count 5, alternating by
// benchstat). kinesalite, not Kinesis, bounds both.
func BenchmarkSend(b *testing.B) {
	srv := throwaway.Kinesalite(b)
	e := setup(b, srv, direct())
	ctx := context.Background()
	stream := e.stream("bench", 4)
	batch := msgs(stream, 500, 100, 200)
	b.Run("sink", func(b *testing.B) {
		for b.Loop() {
			if err := e.sink.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
	in := &kinesis.PutRecordsInput{StreamName: aws.String(stream)}
	for _, m := range batch {
		in.Records = append(in.Records, types.PutRecordsRequestEntry{Data: m.Payload, PartitionKey: aws.String(m.Key)})
	}
	b.Run("raw-sdk", func(b *testing.B) {
		for b.Loop() {
			out, err := e.admin.PutRecords(ctx, in)
			if err != nil {
				b.Fatal(err)
			}
			if aws.ToInt32(out.FailedRecordCount) != 0 {
				b.Fatalf("%d records failed", aws.ToInt32(out.FailedRecordCount))
			}
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
}
