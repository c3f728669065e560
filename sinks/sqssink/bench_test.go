package sqssink

import (
	"context"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// BenchmarkSend is one Send of 500 messages spread over 100 keys (a wide
// batch, as the relay claims for a KeySerial sink) into a FIFO queue on
// goaws, against the same 500 messages as raw SendMessageBatch requests
// of 10 from the same SDK, 8 at a time, with the same attributes and FIFO
// fields but no per-key rounds. Compare the two in one run (-bench .
// -count 5, alternating by benchstat). goaws, not SQS, bounds both.
func BenchmarkSend(b *testing.B) {
	srv := throwaway.StartGoAWS(b)
	e := setup(b, srv, direct())
	ctx := context.Background()
	topic := e.queue("bench", true)
	batch := msgs(topic, 500, 100, 200)
	drain := func(b *testing.B) {
		b.StopTimer()
		// goaws scans its whole queue on every send: keep it short.
		_, _ = e.admin.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(srv.QueueURL(topic))})
		b.StartTimer()
	}
	b.Run("sink", func(b *testing.B) {
		for b.Loop() {
			if err := e.sink.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
			drain(b)
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
	var reqs [][]types.SendMessageBatchRequestEntry
	for i, m := range batch {
		en, err := e.sink.entry(i, m)
		if err != nil {
			b.Fatal(err)
		}
		in := toEntry(en)
		in.Id = aws.String(strconv.Itoa(i % 10))
		if i%10 == 0 {
			reqs = append(reqs, nil)
		}
		reqs[len(reqs)-1] = append(reqs[len(reqs)-1], in)
	}
	b.Run("raw-sdk", func(b *testing.B) {
		for b.Loop() {
			sem := make(chan struct{}, DefaultConcurrency)
			errs := make(chan error, len(reqs))
			for _, r := range reqs {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					_, err := e.admin.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(srv.QueueURL(topic)), Entries: r})
					errs <- err
				}()
			}
			for range reqs {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			drain(b)
		}
		b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msg/s")
	})
}
