package relay_test

import (
	"context"
	"crypto/md5"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// laneSink records, for every batch, the most messages it held from one
// lane, and says whether it is a sinks.KeySerial sink.
type laneSink struct {
	serial  bool
	lanes   int // what BatchLanes says
	mu      sync.Mutex
	perLane []int // per batch: the most messages of one lane
	seqs    map[string][]int64
	total   int
}

func (s *laneSink) KeySerial() bool { return s.serial }

func (s *laneSink) BatchLanes() int { return s.lanes }

func (s *laneSink) Send(_ context.Context, msgs []sinks.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	lanes := map[byte]int{}
	most := 0
	for _, m := range msgs {
		l := md5.Sum([]byte(m.Key))[0]
		lanes[l]++
		most = max(most, lanes[l])
		s.seqs[m.Key] = append(s.seqs[m.Key], m.Seq)
	}
	s.perLane = append(s.perLane, most)
	s.total += len(msgs)
	return nil
}

func (s *laneSink) Close(context.Context) error { return nil }

// A sink that sends a key's messages one round trip after another gets
// batches drawn from many lanes (at most an eighth of a batch from one
// lane), and the worker comes back at once while a lane may hold more:
// the backlog drains with no poll, every key in order. Another sink gets
// whole lanes; one that asks for batches over more lanes (BatchLanes)
// gets them.
func TestKeySerialSinkGetsBatchesAcrossLanes(t *testing.T) {
	t.Parallel()
	const batch, keys, each = 80, 100, 6
	for _, tc := range []struct {
		serial bool
		lanes  int // BatchLanes
		most   int // the most messages of one lane in a batch, 0: more than batch/8
	}{{true, 0, batch / 8}, {true, 40, batch / 40}, {false, 0, 0}} {
		serial := tc.serial
		t.Run(fmt.Sprint("serial=", serial, ",lanes=", tc.lanes), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var msgs []outbox.Message
			for i := range keys * each {
				msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%keys), fmt.Sprint(i)))
			}
			e.write(msgs...)
			sink := &laneSink{serial: serial, lanes: tc.lanes, seqs: map[string][]int64{}}
			cfg := e.config()
			cfg.Workers, cfg.BatchSize = 1, batch
			cfg.PollInterval = time.Hour // only the claims' own "more" keeps the worker going
			e.start(cfg, sink)
			eventually(t, 30*time.Second, func() bool {
				sink.mu.Lock()
				defer sink.mu.Unlock()
				return sink.total >= keys*each
			}, "the backlog drained")
			sink.mu.Lock()
			defer sink.mu.Unlock()
			require.Equal(t, keys*each, sink.total, "each message once")
			for k, seqs := range sink.seqs {
				require.IsIncreasing(t, seqs, "key %s in order", k)
			}
			most := 0
			for _, n := range sink.perLane {
				most = max(most, n)
			}
			if tc.most > 0 {
				require.LessOrEqual(t, most, tc.most, "messages of one lane in a batch: %v", sink.perLane)
			} else {
				require.Greater(t, most, batch/8, "a sink that is not key-serial gets whole lanes: %v", sink.perLane)
			}
		})
	}
}
