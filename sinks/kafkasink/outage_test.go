package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// allNotAttempted reports whether every message of a Send of n failed
// with sinks.ErrNotAttempted.
func allNotAttempted(err error, n int) bool {
	if err == nil {
		return false
	}
	for i := range n {
		if !errors.Is(sinks.Outcome(err, i, n), sinks.ErrNotAttempted) {
			return false
		}
	}
	return true
}

// TestBrokerDownIsNotAttempted: while the broker cannot even be dialled,
// nothing goes on the wire and the sink says so (sinks.ErrNotAttempted),
// so that the relay neither counts an attempt nor pushes each row into
// its exponential retry schedule (which, after a 30 s outage, left the
// tail 39 s behind the recovery). Once the broker is back, the very next
// Send delivers: the sink keeps no reconnect backoff of its own.
func TestBrokerDownIsNotAttempted(t *testing.T) {
	t.Parallel()
	rc := newRestartable(t, kfake.SeedTopics(3, "t"))
	s := newSink(t, rc.cluster(), func(cfg *Config) { cfg.DialTimeout = time.Second })
	ctx := context.Background()
	batch := func() []sinks.Message {
		return []sinks.Message{msg("t", "a", 1, "x"), msg("t", "b", 2, "y"), msg("t", "", 3, "z")}
	}
	require.NoError(t, s.Send(ctx, batch()))

	rc.stop()
	// A connection the broker dropped may fail a request already written
	// (unexpected EOF): that one is an attempt, whose batch the idempotent
	// producer resends for twice metadata_ttl (12s) before the Send gives
	// up. Dials that fail are not attempts.
	var err error
	for i := range 3 {
		err = s.Send(ctx, batch())
		require.Error(t, err)
		require.False(t, sinks.IsPermanent(err), "%v", err)
		t.Logf("send %d with the broker down: %v", i+1, err)
		if allNotAttempted(err, 3) {
			break
		}
	}
	require.True(t, allNotAttempted(err, 3), "the broker refuses connections, yet the messages are reported as attempted: %v", err)
	var oe *net.OpError
	require.ErrorAs(t, sinks.Outcome(err, 0, 3), &oe, "the cause is kept")

	require.NoError(t, rc.start())
	up := time.Now()
	// The sink redials on the next Send, with no backoff of its own: it
	// delivers at the first or second try. 5s leaves room for -race on a
	// loaded machine and still fails a sink that waits for its next
	// metadata refresh (metadata_ttl, 6s by default).
	testkit.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err = s.Send(ctx, batch())
		return err == nil, fmt.Sprintf("not delivering after the broker came back: %v", err)
	})
	t.Logf("delivering again %s after the broker came back", time.Since(up).Round(time.Millisecond))
}

// TestStartedWhileBrokerDown: a sink that never reached the broker fails
// its metadata lookup, which sends nothing either. kafka-go retries the
// lookup in the background at random within metadata_ttl, so the sink
// delivers within about metadata_ttl of the broker's return.
func TestStartedWhileBrokerDown(t *testing.T) {
	t.Parallel()
	rc := newRestartable(t, kfake.SeedTopics(1, "t"))
	const ttl = time.Second
	// New does not connect: the broker is gone before the first Send.
	s := newSink(t, rc.cluster(), func(cfg *Config) { cfg.DialTimeout = time.Second; cfg.MetadataTTL = ttl })
	rc.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := s.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")})
	require.True(t, allNotAttempted(err, 1), "%v", err)

	require.NoError(t, rc.start())
	up := time.Now()
	// Within metadata_ttl of the broker's return, plus 5s for -race on a
	// loaded machine.
	testkit.Eventually(t, ttl+5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err = s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "x")})
		return err == nil, fmt.Sprintf("not delivering after the broker came back: %v", err)
	})
	t.Logf("delivering %s after the broker came back (metadata_ttl %s)", time.Since(up).Round(time.Millisecond), ttl)
}
