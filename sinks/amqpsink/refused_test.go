package amqpsink

import (
	"context"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// countingHandler counts the records at each level.
type countingHandler struct {
	mu     sync.Mutex
	counts map[slog.Level]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Level]++
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
func (h *countingHandler) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[l]
}

// A password the broker refuses is said once however often the sink
// redials, Healthy names it, and CheckStart fails with it; a broker that
// is simply unreachable does not fail CheckStart.
func TestRefusedCredentials(t *testing.T) {
	t.Parallel()
	setup(t) // the shared broker is up
	u, err := url.Parse(testkit.AMQPURL())
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	h := &countingHandler{counts: map[slog.Level]int{}}
	s, err := New(Config{URL: u.String(), Exchange: "amq.topic", ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond}, slog.New(h))
	require.NoError(t, err)
	defer s.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = s.CheckStart(ctx)
	require.ErrorIs(t, err, ErrAccessRefused)
	require.ErrorContains(t, err, "403")

	testkit.Eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.dials >= 2, "fewer than 2 refused attempts"
	})
	require.Equal(t, 1, h.count(slog.LevelError), "the refusal is logged once")
	require.Zero(t, h.count(slog.LevelWarn), "no warning per redial")
	require.ErrorIs(t, s.Healthy(context.Background()), ErrAccessRefused)

	// Nobody listens on port 1: a failure that may pass.
	down, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", Exchange: "amq.topic"}, nil)
	require.NoError(t, err)
	defer down.Close(context.Background())
	require.NoError(t, down.CheckStart(context.Background()))
}
