package sinktest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// A conformance suite that passes everything proves nothing. Each case
// below breaks the memory sink (or its harness) in one way a real sink
// could be broken, runs the suite against it in a child process (a failing
// subtest cannot be observed from inside the same test binary), and checks
// that the suite fails in the expected subtest for the expected reason.
func TestSuiteCatchesBrokenSinks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		broken, subtest, want string
	}{
		{"reorder", "BatchOrderPerKey", "arrived before"},
		{"ignore-ctx", "CancelledContext", "Send with a cancelled context must fail"},
		{"transient-permanent", "TransientThenRecover", "a transient failure was reported permanent"},
		{"drop-headers", "HeadersSurvive", `header "content-type" missing`},
		{"flatten-batch-error", "PartialFailureIndex", "must return a *sinks.BatchError"},
		{"truncate-payload", "PayloadBytesExact", "payload differs"},
		{"close-twice-fails", "CloseIdempotent", "Close #2"},
		{"no-key-stop", "PerKeyStop", "must not be attempted"},
		{"chunks-forget-failures", "WideBatchPerKey", "must not be attempted"},
		{"rewrite-id", "SendOne", "unknown id"},
		{"drop-seq", "SendOne", "position (Seq)"},
		{"empty-delivers", "EmptyBatch", "an empty batch delivered something"},
		{"outage-plain", "OutageNotAttempted", "its failure does not say so"},
		{"outage-permanent", "OutageNotAttempted", "an outage was reported permanent"},
		{"no-reason", "", `Features.Why["Restart"] is empty`},
	}
	for _, tc := range cases {
		t.Run(tc.broken, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBrokenSink$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "SINKTEST_BROKEN="+tc.broken)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "the suite passed a sink broken by %q:\n%s", tc.broken, out)
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "child did not run:\n%s", out)
			require.Contains(t, string(out), tc.want, "wrong failure reason for %q", tc.broken)
			if tc.subtest != "" {
				require.Contains(t, string(out), "--- FAIL: TestBrokenSink/"+tc.subtest, "failure reported in the wrong subtest for %q:\n%s", tc.broken, out)
			}
		})
	}
}

// TestBrokenSink is the child side of TestSuiteCatchesBrokenSinks.
func TestBrokenSink(t *testing.T) {
	broken := os.Getenv("SINKTEST_BROKEN")
	if broken == "" {
		t.Skip("runs only as a child process of TestSuiteCatchesBrokenSinks (SINKTEST_BROKEN unset)")
	}
	why := map[string]string{
		"Partitions": "memory has no partitions",
		"Restart":    "memory has nothing to restart",
	}
	if broken == "no-reason" {
		delete(why, "Restart")
	}
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Outage: true, Why: why},
		Setup:    func(t *testing.T) *sinktest.Env { return brokenEnv(t, broken) },
	})
}

// wrapped lets a case replace Send or Close of the memory sink.
type wrapped struct {
	*memory.Sink
	send   func(ctx context.Context, msgs []sinks.Message) error
	closes atomic.Int32
	broken string
}

func (w *wrapped) Send(ctx context.Context, msgs []sinks.Message) error {
	if w.send != nil {
		return w.send(ctx, msgs)
	}
	return w.Sink.Send(ctx, msgs)
}

func (w *wrapped) Close(ctx context.Context) error {
	if w.closes.Add(1) > 1 && w.broken == "close-twice-fails" {
		return errors.New("already closed")
	}
	return w.Sink.Close(ctx)
}

func brokenEnv(t *testing.T, broken string) *sinktest.Env {
	s := memory.New()
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	var down, out atomic.Bool
	s.SetFail(func(m sinks.Message) error {
		if out.Load() {
			err := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
			switch broken {
			case "outage-plain":
				return err // retriable, but says nothing of the destination
			case "outage-permanent":
				return sinks.Permanent(err)
			}
			return sinks.NotSent(err)
		}
		if down.Load() {
			err := errors.New("backend down")
			if broken == "transient-permanent" {
				return sinks.Permanent(err)
			}
			return err
		}
		if m.Headers["poison"] != "" {
			return sinks.Permanent(errors.New("poison"))
		}
		return nil
	})
	w := &wrapped{Sink: s, broken: broken}
	switch broken {
	case "ignore-ctx":
		w.send = func(_ context.Context, msgs []sinks.Message) error { return s.Send(context.Background(), msgs) }
	case "flatten-batch-error":
		w.send = func(ctx context.Context, msgs []sinks.Message) error {
			if err := s.Send(ctx, msgs); err != nil {
				return errors.New(err.Error())
			}
			return nil
		}
	case "no-key-stop":
		// Sends one message at a time and forgets earlier failures.
		w.send = func(ctx context.Context, msgs []sinks.Message) error {
			be := sinks.NewBatchError(len(msgs))
			for i, m := range msgs {
				be.Errs[i] = sinks.Outcome(s.Send(ctx, []sinks.Message{m}), 0, 1)
			}
			return be.Err()
		}
	case "chunks-forget-failures":
		// Splits a large batch into chunks sent one after the other, each
		// with its own ordering state: a key failing in one chunk goes on
		// in the next.
		w.send = func(ctx context.Context, msgs []sinks.Message) error {
			if len(msgs) <= 8 {
				return s.Send(ctx, msgs)
			}
			be := sinks.NewBatchError(len(msgs))
			size := (len(msgs) + 3) / 4
			for lo := 0; lo < len(msgs); lo += size {
				hi := min(lo+size, len(msgs))
				err := s.Send(ctx, msgs[lo:hi])
				for i := lo; i < hi; i++ {
					be.Errs[i] = sinks.Outcome(err, i-lo, hi-lo)
				}
			}
			return be.Err()
		}
	case "empty-delivers":
		w.send = func(ctx context.Context, msgs []sinks.Message) error {
			if len(msgs) == 0 {
				msgs = []sinks.Message{sinktest.Msg("x", "", 0, nil)}
			}
			return s.Send(ctx, msgs)
		}
	}
	var cursor int
	return &sinktest.Env{
		Sink:  w,
		Topic: func(suffix string) string { return "t." + suffix },
		Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
			if err := s.WaitFor(ctx, cursor+n); err != nil {
				return nil, err
			}
			var out []sinktest.Delivered
			for _, m := range s.Delivered()[cursor : cursor+n] {
				d := sinktest.Delivered{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: m.Headers, Partition: -1}
				switch broken {
				case "drop-headers":
					d.Headers = nil
				case "truncate-payload":
					if len(d.Payload) > 0 {
						d.Payload = d.Payload[:len(d.Payload)-1]
					}
				case "rewrite-id":
					d.ID = sinktest.NewID()
				case "drop-seq":
					d.Seq = 0
				}
				out = append(out, d)
			}
			cursor += n
			if broken == "reorder" {
				slices.Reverse(out)
			}
			return out, nil
		},
		Poison: func(topic string) sinks.Message {
			m := sinktest.Msg(topic, "", 0, []byte("p"))
			m.Headers = map[string]string{"poison": "1"}
			return m
		},
		BreakTransient: func() func() {
			down.Store(true)
			return func() { down.Store(false) }
		},
		Down: func() error { out.Store(true); return nil },
		Up:   func() error { out.Store(false); return nil },
	}
}

func TestNewIDIsUUIDv4(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := sinktest.NewID()
		require.Len(t, id, 36)
		parts := strings.Split(id, "-")
		require.Len(t, parts, 5)
		require.Equal(t, byte('4'), id[14], "version nibble")
		require.Contains(t, "89ab", string(id[19]), "variant nibble")
		require.False(t, seen[id], "duplicate id")
		seen[id] = true
	}
	m := sinktest.Msg("t", "k", 3, []byte("p"))
	require.Equal(t, 1, m.Attempt)
	require.False(t, m.CreatedAt.IsZero())
}
