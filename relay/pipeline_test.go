package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// overlapSink holds each batch until another batch reaches it (or
// partnerWait passes), so that a worker with a pipeline shows two batches
// in flight at once; it records the most batches it held together and
// any key found in two of them.
type overlapSink struct {
	partner chan struct{}
	mu      sync.Mutex
	active  map[string]bool // keys of the batches being sent
	held    int             // batches being sent
	most    int             // most batches sent at once
	shared  []string        // keys of two batches sent at once
	seqs    map[string][]int64
	total   int
	failed  map[int64]bool // messages refused once already
}

const partnerWait = 200 * time.Millisecond

func newOverlapSink() *overlapSink {
	return &overlapSink{partner: make(chan struct{}), active: map[string]bool{}, seqs: map[string][]int64{}, failed: map[int64]bool{}}
}

func (s *overlapSink) Send(ctx context.Context, msgs []sinks.Message) error {
	keys := map[string]bool{}
	for _, m := range msgs {
		keys[m.Key] = true
	}
	s.mu.Lock()
	for k := range keys {
		if s.active[k] {
			s.shared = append(s.shared, k)
		}
		s.active[k] = true
	}
	s.held++
	s.most = max(s.most, s.held)
	s.mu.Unlock()

	t := time.NewTimer(partnerWait)
	select {
	case s.partner <- struct{}{}:
	case <-s.partner:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()

	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range keys {
		delete(s.active, k)
	}
	s.held--
	// Every seventh message is refused once; the later messages of its
	// key in the batch are then not attempted, as a real sink does.
	be := sinks.NewBatchError(len(msgs))
	refused := map[string]bool{}
	for i, m := range msgs {
		switch {
		case refused[m.Key]:
			be.Errs[i] = sinks.ErrNotAttempted
		case m.Seq%7 == 3 && !s.failed[m.Seq]:
			s.failed[m.Seq] = true
			refused[m.Key] = true
			be.Errs[i] = errors.New("refused once")
		default:
			s.seqs[m.Key] = append(s.seqs[m.Key], m.Seq)
			s.total++
		}
	}
	return be.Err()
}

func (s *overlapSink) Close(context.Context) error { return nil }

// A worker claims its next batch while the sink still holds the last one
// (Pipeline 2), never from a lane of a batch in flight: no key is ever in
// two batches at once, and each key arrives in order and each message
// once, though every seventh message is refused once (its retry holds
// back the rest of its key while other batches are in flight). With
// Pipeline 1 the sink never holds two batches.
func TestPipelineOverlapsBatchesOfOtherKeys(t *testing.T) {
	t.Parallel()
	const keys, each = 40, 10
	for _, depth := range []int{2, 1} {
		t.Run(fmt.Sprint("pipeline=", depth), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var msgs []outbox.Message
			for i := range keys * each {
				msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%keys), fmt.Sprint(i)))
			}
			e.write(msgs...)
			sink := newOverlapSink()
			cfg := e.config()
			// One worker, batches of two whole lanes: several batches
			// of different keys are ready at once.
			cfg.Workers, cfg.Pipeline, cfg.BatchSize = 1, depth, 2*each
			cfg.PollInterval = time.Hour // the claims' "more", the batches' ends and the watcher keep the worker going
			cfg.RetryInitial, cfg.RetryJitter = 50*time.Millisecond, -1
			e.start(cfg, sink)
			eventually(t, 60*time.Second, func() bool {
				sink.mu.Lock()
				defer sink.mu.Unlock()
				return sink.total >= keys*each
			}, "the backlog drained")
			sink.mu.Lock()
			defer sink.mu.Unlock()
			require.Equal(t, keys*each, sink.total, "each message once")
			require.Empty(t, sink.shared, "keys in two batches in flight at once")
			for k, seqs := range sink.seqs {
				require.IsIncreasing(t, seqs, "key %s in order", k)
			}
			require.Equal(t, depth, sink.most, "most batches in flight at once")
		})
	}
}
