package httpsink

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// BenchmarkSend posts batches of 500 messages of 200 bytes, signed, to a
// local net/http server that discards them, at max_concurrency 64. It
// measures the sink plus net/http on loopback, with both ends sharing the
// CPUs, for two batch shapes: 500 keys (one message each, what a
// breadth-first claim takes from a wide backlog) and 5 keys of 100
// messages (what the lane-local claim took from a 1,000-key backlog).
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	s, err := New(Config{URL: srv.URL + "/hook", Secrets: []sinkconf.Secret{secretA}, MaxConcurrency: 64}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()

	const batchSize = 500
	payload := make([]byte, 200)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for _, keys := range []int{500, 5} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			batch := make([]sinks.Message, batchSize)
			for i := range batch {
				batch[i] = sinks.Message{
					ID:      fmt.Sprintf("00000000-0000-4000-8000-%012d", i),
					Topic:   "bench.events",
					Key:     fmt.Sprintf("key-%d", i%keys),
					Payload: payload,
					Headers: map[string]string{"content-type": "application/json"},
				}
			}
			ctx := context.Background()
			for b.Loop() {
				if err := s.Send(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
