package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/sinks"
)

var (
	errDown    = errors.New("connection refused")
	errBad     = sinks.Permanent(errors.New("400 bad request"))
	errNA      = sinks.ErrNotAttempted
	errRefused = sinks.NotSent(errors.New("connection refused"))
	err503     = sinks.Unavailable(errors.New("503 Service Unavailable"))
	// errThrottled: not attempted, for the sink's own reasons.
	errThrottled = fmt.Errorf("%w (waiting for rate_limit: would exceed the deadline)", sinks.ErrNotAttempted)
)

// TestDown decides, for batches and answers, whether the destination is
// down as a whole (no attempt counted, the breaker opens) or the batch is
// settled message by message.
func TestDown(t *testing.T) {
	type msg struct {
		key    string
		answer error
	}
	up := func(sinks.Message) error { return nil }
	downToo := func(sinks.Message) error { return errors.New("HEAD: 503") }
	for _, tc := range []struct {
		name    string
		probe   bool
		batch   []msg
		whole   error
		confirm func(sinks.Message) error // the sink's Prober; nil: none
		want    reading
	}{
		{"a refused connection for every message", false, []msg{{"a", errRefused}, {"b", errRefused}}, nil, nil, isDown},
		{"refused for one key, the rest held behind it", false, []msg{{"a", errRefused}, {"a", errNA}}, nil, nil, isDown},
		{"503 across two keys", false, []msg{{"a", err503}, {"b", err503}}, nil, nil, isDown},
		{"503 for two keyless messages", false, []msg{{"", err503}, {"", err503}}, nil, nil, isDown},
		{"503 for one key only: that message's own, perhaps", false, []msg{{"a", err503}, {"a", errNA}}, nil, nil, reached},
		{"503 for one key, as the probe", true, []msg{{"a", err503}}, nil, nil, isDown},
		{"one delivered", false, []msg{{"a", errRefused}, {"b", nil}}, nil, nil, reached},
		{"one failed on its own", false, []msg{{"a", err503}, {"b", err503}, {"c", errBad}}, nil, nil, reached},
		{"a plain retriable error", false, []msg{{"a", err503}, {"b", errDown}}, nil, nil, reached},
		{"every message held back without a cause", false, []msg{{"a", errNA}, {"b", errNA}}, nil, nil, untouched},
		{"not sent, but for the sink's own reasons", false, []msg{{"a", errThrottled}, {"b", errThrottled}}, nil, nil, untouched},
		{"not sent for the sink's own reasons beside a refusal", false, []msg{{"a", errThrottled}, {"b", errRefused}}, nil, nil, isDown},
		{"refused for the whole batch", false, []msg{{"a", nil}, {"b", nil}}, errRefused, nil, isDown},
		{"all delivered", false, []msg{{"a", nil}}, nil, nil, reached},
		// A Prober tells a receiver that is down from messages that fail.
		{"503 across two keys, the receiver up", false, []msg{{"a", err503}, {"b", err503}}, nil, up, reached},
		{"503 across two keys, the receiver down", false, []msg{{"a", err503}, {"b", err503}}, nil, downToo, isDown},
		{"503 for one key, the receiver down", false, []msg{{"a", err503}, {"a", errNA}}, nil, downToo, isDown},
		{"503 for the probe, the receiver up", true, []msg{{"a", err503}}, nil, up, reached},
		{"503 for the probe, the receiver down", true, []msg{{"a", err503}}, nil, downToo, isDown},
		{"refused, whatever the probe says", false, []msg{{"a", errRefused}, {"b", err503}}, nil, up, isDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch := make([]claim.Row, len(tc.batch))
			be := sinks.NewBatchError(len(tc.batch))
			for i, m := range tc.batch {
				batch[i] = claim.Row{Msg: sinks.Message{Seq: int64(i + 1), Key: m.key}}
				be.Errs[i] = m.answer
			}
			var sendErr error = be
			if tc.whole != nil {
				sendErr = tc.whole
			} else if be.Failed() == 0 {
				sendErr = nil
			}
			got, cause := down(batch, sendErr, tc.probe, tc.confirm)
			if got != tc.want {
				t.Fatalf("down = %v, want %v", got, tc.want)
			}
			if got != reached && cause == nil {
				t.Fatal("down without a cause")
			}
		})
	}
}

// TestBreaker walks the breaker through an outage on a fake clock: it
// opens, lets one worker at a time probe on a growing backoff, passes an
// empty probe on to the next worker, and closes on the first probe that
// gets through.
func TestBreaker(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	var woken []int
	b := newBreaker(2, slog.New(slog.DiscardHandler), NopHooks{}, nil, func(w int) { woken = append(woken, w) })
	b.now = func() time.Time { return now }

	if a := b.admit(0); !a.ok || a.probe {
		t.Fatalf("closed: %+v", a)
	}
	b.landed(1, false, foundDown, errRefused)
	st := b.State()
	if !st.Open || !errors.Is(st.Cause, errRefused) || !st.Since.Equal(now) {
		t.Fatalf("not open: %+v", st)
	}
	// Worker 1 found it down: its turn to probe, after the backoff.
	a := b.admit(1)
	if a.ok || a.at.IsZero() || a.changed == nil {
		t.Fatalf("probe before the backoff: %+v", a)
	}
	if a := b.admit(0); a.ok || !a.at.IsZero() {
		t.Fatalf("worker 0 not on turn: %+v", a)
	}
	now = a.at
	if a := b.admit(1); !a.ok || !a.probe {
		t.Fatalf("no probe when due: %+v", a)
	}
	if a := b.admit(1); a.ok {
		t.Fatalf("a second probe while one is in flight: %+v", a)
	}
	// The probe finds it down: the turn moves to worker 0, whose wait
	// channel closes, and the backoff grows.
	first := a.at.Sub(b.state.Since)
	b.landed(1, true, foundDown, err503)
	select {
	case <-a.changed:
	default:
		t.Fatal("the waiting workers were not told")
	}
	a = b.admit(0)
	if a.ok || a.at.Sub(now) <= first/2 {
		t.Fatalf("second probe: %+v (first after %s)", a, first)
	}
	if st := b.State(); st.Probes != 1 || !errors.Is(st.Cause, err503) {
		t.Fatalf("after a failed probe: %+v", st)
	}
	if len(woken) != 1 || woken[0] != 0 {
		t.Fatalf("woken %v: the worker whose turn it is may be idle", woken)
	}
	// Worker 0's probe finds nothing in its lanes: worker 1 probes at
	// once.
	now = a.at
	if a := b.admit(0); !a.probe {
		t.Fatalf("worker 0: %+v", a)
	}
	b.landed(0, true, foundNothing, nil)
	if a := b.admit(1); !a.probe {
		t.Fatalf("worker 1 after an empty probe: %+v", a)
	}
	// It gets through: closed, every worker claims.
	b.landed(1, true, wentThrough, nil)
	if st := b.State(); st.Open {
		t.Fatalf("still open: %+v", st)
	}
	for w := range 2 {
		if a := b.admit(w); !a.ok || a.probe {
			t.Fatalf("worker %d after closing: %+v", w, a)
		}
	}

	// Every worker's probe finds nothing: nothing to probe with, closed.
	b.landed(0, false, foundDown, errRefused)
	for range 2 {
		now = now.Add(time.Minute)
		turn := b.turn
		if a := b.admit(turn); !a.probe {
			t.Fatalf("worker %d: %+v", turn, a)
		}
		b.landed(turn, true, foundNothing, nil)
	}
	if b.State().Open {
		t.Fatal("open with nothing to probe with")
	}

	// A destination that asks for time gets it.
	b.landed(0, false, foundDown, sinks.Unavailable(&sinks.RetryAfterError{Err: errors.New("503"), After: time.Hour}))
	if a := b.admit(0); a.at.Sub(now) < time.Hour {
		t.Fatalf("Retry-After ignored: probe at %s", a.at.Sub(now))
	}
}

// TestSlowDown: a Retry-After pauses the route only when the destination
// said it of every message it was asked about, across two keys or more;
// one key's Retry-After is that message's retry delay.
func TestSlowDown(t *testing.T) {
	wait := func(d time.Duration) error {
		return &sinks.RetryAfterError{Err: errors.New("429 Too Many Requests"), After: d}
	}
	type msg struct {
		key    string
		answer error
	}
	for _, tc := range []struct {
		name  string
		batch []msg
		want  time.Duration
	}{
		{"one key's 429", []msg{{"a", wait(time.Hour)}, {"a", errNA}}, 0},
		{"one key's 429 beside deliveries", []msg{{"a", wait(time.Hour)}, {"b", nil}, {"c", nil}}, 0},
		{"429 across two keys", []msg{{"a", wait(time.Second)}, {"b", wait(2 * time.Second)}}, 2 * time.Second},
		{"429 for two keyless messages", []msg{{"", wait(time.Second)}, {"", wait(time.Second)}}, time.Second},
		{"429 across keys beside a plain failure", []msg{{"a", wait(time.Second)}, {"b", wait(time.Second)}, {"c", errDown}}, 0},
		{"429 across keys beside a permanent failure", []msg{{"a", wait(time.Second)}, {"b", wait(time.Second)}, {"c", errBad}}, time.Second},
		{"no answer asked to wait", []msg{{"a", errDown}, {"b", errDown}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch := make([]claim.Row, len(tc.batch))
			be := sinks.NewBatchError(len(tc.batch))
			for i, m := range tc.batch {
				batch[i] = claim.Row{Msg: sinks.Message{Seq: int64(i + 1), Key: m.key}}
				be.Errs[i] = m.answer
			}
			d, cause := slowDown(batch, be.Err())
			require.Equal(t, tc.want, d)
			require.Equal(t, d > 0, cause != nil)
		})
	}
}
