package memory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// poisonHeader marks the messages the memory backend refuses. The memory
// sink has no backend that can reject anything, so the harness installs a
// SetFail hook that plays that part.
const poisonHeader = "x-sinktest-poison"

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{
			Poison:    true,
			Transient: true,
			Outage:    true,
			Why: map[string]string{
				"Partitions": "the memory sink keeps one ordered list; it has no partitions",
				"Restart":    "the memory sink has no connection or backend process to drop or restart",
			},
		},
		Setup: setup,
	})
}

func setup(t *testing.T) *sinktest.Env {
	s := memory.New()
	t.Cleanup(func() {
		require.NoError(t, s.Close(context.Background()))
		require.Empty(t, s.Violations(), "the suite sent one key from two concurrent Sends")
	})
	var broken, down atomic.Bool
	s.SetFail(func(m sinks.Message) error {
		if down.Load() {
			// What a network sink reports when its destination refuses
			// connections: nothing was sent.
			return sinks.NotSent(errors.New("memory: destination down (sinktest Down)"))
		}
		if broken.Load() {
			return errors.New("memory: backend unavailable (sinktest BreakTransient)")
		}
		if m.Headers[poisonHeader] != "" {
			return sinks.Permanent(errors.New("memory: message rejected (sinktest poison)"))
		}
		return nil
	})
	var cursor int // how many delivered messages Read has returned
	return &sinktest.Env{
		Sink:  s,
		Topic: func(suffix string) string { return "sinktest." + suffix },
		// The memory sink's delivered list is the backend: a message is
		// on it exactly when Send reported it delivered.
		Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
			if err := s.WaitFor(ctx, cursor+n); err != nil {
				return nil, err
			}
			msgs := s.Delivered()[cursor : cursor+n]
			cursor += n
			out := make([]sinktest.Delivered, len(msgs))
			for i, m := range msgs {
				out[i] = sinktest.Delivered{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: m.Headers, Partition: -1}
			}
			return out, nil
		},
		Poison: func(topic string) sinks.Message {
			m := sinktest.Msg(topic, "", 0, []byte("poison"))
			m.Headers = map[string]string{poisonHeader: "1"}
			return m
		},
		BreakTransient: func() func() {
			broken.Store(true)
			return func() { broken.Store(false) }
		},
		Down: func() error { down.Store(true); return nil },
		Up:   func() error { down.Store(false); return nil },
	}
}

// TestSendAfterCloseIsErrClosed pins the bare sentinel the relay matches on.
func TestSendAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	s := memory.New()
	require.NoError(t, s.Close(t.Context()))
	require.ErrorIs(t, s.Send(t.Context(), []sinks.Message{sinktest.Msg("t", "k", 1, nil)}), sinks.ErrClosed)
}
