package relay_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// sizeSink records what each batch weighed and the live heap while the
// batch was in its hands, and keeps no payload (so the relay's own memory
// is what the heap shows).
type sizeSink struct {
	mu       sync.Mutex
	batches  []sizedBatch
	seqs     map[string][]int64 // per key, in delivery order
	peakLive uint64
	measure  bool
	total    int
}

type sizedBatch struct{ n, bytes int }

func newSizeSink(measure bool) *sizeSink {
	return &sizeSink{seqs: map[string][]int64{}, measure: measure}
}

func (s *sizeSink) Send(_ context.Context, msgs []sinks.Message) error {
	b := sizedBatch{n: len(msgs)}
	for _, m := range msgs {
		b.bytes += len(m.Payload)
	}
	var live uint64
	if s.measure {
		// Garbage from earlier batches is not what a worker needs: collect
		// it, then read what is live while this batch is held.
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		live = ms.HeapAlloc
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, b)
	for _, m := range msgs {
		s.seqs[m.Key] = append(s.seqs[m.Key], m.Seq)
	}
	s.total += len(msgs)
	s.peakLive = max(s.peakLive, live)
	return nil
}

func (s *sizeSink) Close(context.Context) error { return nil }

func (s *sizeSink) delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// checkBatches asserts that every batch of more than one message stays
// within limit bytes of payload, and that each key's messages arrived
// once each, in id order.
func (s *sizeSink) checkBatches(t *testing.T, limit int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, b := range s.batches {
		if b.n > 1 {
			require.LessOrEqual(t, b.bytes, limit, "batch %d: %d messages, %d payload bytes", i, b.n, b.bytes)
		}
	}
	for k, seqs := range s.seqs {
		for i := 1; i < len(seqs); i++ {
			require.Greater(t, seqs[i], seqs[i-1], "key %q: %d delivered after %d", k, seqs[i], seqs[i-1])
		}
	}
}

// The default byte limit the relay promises (Config.BatchBytes).
const wantDefaultBatchBytes = relay.DefaultBatchBytes

// TestLargePayloadBatchesBoundedByBytes: a backlog of 1 MiB messages (and
// two above the byte limit) with the default configuration. Before batches
// were bounded by bytes, one claim took the whole backlog (up to 500
// messages of up to 16 MiB: gigabytes in one worker). Not parallel: it
// measures the process's heap.
func TestLargePayloadBatchesBoundedByBytes(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	// 80 messages of 1 MiB over 8 keys, and two of 16.5 MiB (above the
	// byte limit, below the message limit) in the middle
	// of keys k3 and k6. The payloads compress to almost nothing in the
	// database; the relay receives every byte.
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table("messages")+` (topic, key, payload)
SELECT 't', 'k' || (g % 8), convert_to(repeat('x', CASE WHEN g IN (43, 46) THEN (16 << 20) + (1 << 19) ELSE 1 << 20 END), 'UTF8')
FROM generate_series(1, 82) g ORDER BY g`)
	require.NoError(t, err)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc

	sink := newSizeSink(true)
	cfg := e.config()
	cfg.Workers = 1
	cfg.BatchSize = 0 // the default, 500
	e.start(cfg, sink)
	eventually(t, 3*time.Minute, func() bool { return sink.delivered() >= 82 }, "delivered %d of 82", sink.delivered())

	sink.mu.Lock()
	growth := int64(sink.peakLive) - int64(base)
	t.Logf("batches (messages, payload bytes): %v; peak live heap %d MiB above the %d MiB before the relay started",
		sink.batches, growth>>20, base>>20)
	sink.mu.Unlock()
	sink.checkBatches(t, wantDefaultBatchBytes)
	// One worker holding its batch: the payloads (at most 16 MiB, or one
	// message of 16.5 MiB) and what pgx and the relay keep around them.
	require.Less(t, growth, int64(64<<20), "one worker's live heap grew by %d MiB", growth>>20)
}

// byteMix writes n messages over keys k0..k9 whose payloads (500 B to
// 4.5 kB, and every 37th of 15 kB) make a 10 kB limit cut batches in the
// middle of keys, plus a run of key "hot" with priority on its last
// message: the priority claim's batch is that key's whole run, cut too.
func byteMix(topic string, n int) []outbox.Message {
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		size := 500 + (i*977)%4000
		if i%37 == 0 {
			size = 15000
		}
		msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%10), Payload: []byte(strings.Repeat("p", size))})
	}
	for i := 0; i < 12; i++ {
		m := outbox.Message{Topic: topic, Key: "hot", Payload: []byte(strings.Repeat("h", 3000))}
		if i == 11 {
			m.Priority = 5
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// TestBatchBytesCutKeepsKeyOrder: with a small byte limit, batches are cut
// in the middle of keys and lanes, in the plain claim, the priority claim
// and a fan-out destination's claim; every message still arrives once, in
// key order, and no batch of several messages passes the limit.
func TestBatchBytesCutKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	const limit = 10000
	check := func(t *testing.T, sink *sizeSink, want int) {
		t.Helper()
		eventually(t, 60*time.Second, func() bool { return sink.delivered() >= want }, "not all %d messages delivered", want)
		sink.checkBatches(t, limit)
		sink.mu.Lock()
		defer sink.mu.Unlock()
		require.Equal(t, want, sink.total, "every message exactly once (nothing fails)")
		seen := map[int64]bool{}
		for _, seqs := range sink.seqs {
			for _, q := range seqs {
				require.False(t, seen[q], "message %d delivered twice", q)
				seen[q] = true
			}
		}
		var cut, alone int
		for _, b := range sink.batches {
			switch {
			case b.n == 1 && b.bytes > limit:
				alone++
			case b.n > 1 && b.bytes+4500 > limit:
				cut++ // the next message would not have fitted
			}
		}
		require.Positive(t, cut, "some batches were cut by bytes: %v", sink.batches)
		require.Positive(t, alone, "messages above the limit went alone: %v", sink.batches)
	}

	t.Run("outbox", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		msgs := byteMix("t", 400)
		e.write(msgs...)
		sink := newSizeSink(false)
		cfg := e.config()
		cfg.BatchBytes = limit
		// No polls: after a batch the byte limit cut, the worker must come
		// back by itself for the rest.
		cfg.PollInterval = time.Hour
		e.start(cfg, sink)
		check(t, sink, len(msgs))
	})

	t.Run("fan-out destination", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		router, kcfg, hcfg := e.fanOutConfigs()
		kcfg.BatchBytes, hcfg.BatchBytes = limit, limit
		msgs := byteMix("orders.created", 400)
		e.write(msgs...)
		ksink, hsink := newSizeSink(false), newSizeSink(false)
		e.start(router, nil)
		e.start(kcfg, ksink)
		e.start(hcfg, hsink)
		check(t, ksink, len(msgs))
		check(t, hsink, len(msgs))
	})
}

// TestOversizeMessageDeadLetteredUnread: a message over MaxMessageBytes,
// written by plain SQL (which checks no size), among small ones of its key
// and of others. Before the limit existed the relay read every row whole,
// and one 150 MB row OOM-killed every relay that took its lane, forever.
// Now it is dead-lettered, its content moved inside the database, never
// handed to the sink; its key moves on behind it (skip) or waits (hold),
// and every other message is delivered in key order.
func TestOversizeMessageDeadLetteredUnread(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{relay.OnDeadLetterSkip, relay.OnDeadLetterHold} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			// k0: 1, 2, big (3), 4, 5; k1: 6..10; a keyless big one (11).
			_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table("messages")+` (topic, key, payload)
SELECT 't', CASE WHEN g = 11 THEN NULL ELSE 'k' || ((g - 1) / 5) END,
       convert_to(repeat('x', CASE WHEN g IN (3, 11) THEN 300000 ELSE 100 END), 'UTF8')
FROM generate_series(1, 11) g ORDER BY g`)
			require.NoError(t, err)
			sink := newSizeSink(false)
			read := &readHooks{}
			cfg := e.config()
			cfg.MaxMessageBytes = 100000
			cfg.OnDeadLetter = policy
			cfg.Hooks = read
			e.start(cfg, sink)
			want := 8 // k0's 1, 2, 4, 5 and k1's five
			if policy == relay.OnDeadLetterHold {
				want = 7 // k0's 4 and 5 wait behind its dead letter
			}
			eventually(t, 30*time.Second, func() bool { return sink.delivered() >= want && e.count("dead_letters") == 2 },
				"delivered %d of %d, dead letters %d of 2", sink.delivered(), want, e.count("dead_letters"))
			sink.checkBatches(t, 1<<30)
			sink.mu.Lock()
			for _, b := range sink.batches {
				require.Less(t, b.bytes, 100000*b.n, "an oversize payload reached the sink: %v", sink.batches)
			}
			sink.mu.Unlock()
			var reason, lastErr string
			var size int
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT reason, last_error, octet_length(payload) FROM `+e.table("dead_letters")+` WHERE id = 3`).Scan(&reason, &lastErr, &size))
			require.Equal(t, relay.ReasonPermanent, reason)
			require.Contains(t, lastErr, "max-message-bytes 100000")
			require.Equal(t, 300000, size, "the dead letter keeps the whole payload")
			require.Less(t, read.largest.Load(), int64(100000), "the relay read an oversize payload")
			if policy == relay.OnDeadLetterHold {
				sink.mu.Lock()
				require.Equal(t, []int64{1, 2}, sink.seqs["k0"], "k0 waits behind its dead letter")
				sink.mu.Unlock()
			}
		})
	}
}

// readHooks records the largest payload the relay held in a batch.
type readHooks struct {
	relay.NopHooks
	largest atomic.Int64
}

func (h *readHooks) Batch(ev relay.BatchEvent) {
	for _, m := range ev.Messages {
		if n := int64(len(m.Payload)); n > h.largest.Load() {
			h.largest.Store(n)
		}
	}
}
