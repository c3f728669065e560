package discard_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCountsConcurrentSends(t *testing.T) {
	t.Parallel()
	s, err := discard.New(discard.Config{}, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				m := sinktest.Msg("t", fmt.Sprintf("g%d", g), int64(i), []byte("12345"))
				if err := s.Send(t.Context(), []sinks.Message{m, m}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Send(t.Context(), nil))
	require.Equal(t, int64(8*100*2), s.Messages())
	require.Equal(t, int64(8*100*2*5), s.Bytes())
}

func TestCancelledContextAndClose(t *testing.T) {
	t.Parallel()
	s, err := discard.New(discard.Config{}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = s.Send(ctx, []sinks.Message{sinktest.Msg("t", "k", 1, []byte("x"))})
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, sinks.IsPermanent(err))
	require.Zero(t, s.Messages(), "a failed Send must not count")

	require.NoError(t, s.Close(t.Context()))
	require.NoError(t, s.Close(t.Context()), "Close is idempotent")
	require.ErrorIs(t, s.Send(t.Context(), []sinks.Message{sinktest.Msg("t", "k", 1, nil)}), sinks.ErrClosed)
	require.Zero(t, s.Messages())
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"discard", "discard:", "discard://"} {
		_, err := discard.ParseURL(ok)
		require.NoError(t, err, ok)
	}
	for raw, want := range map[string]string{
		"":                  `scheme is ""`,
		"stdout://":         `scheme is "stdout"`,
		"discard://x":       "nothing after the scheme",
		"discard://?rate=1": `unknown URL parameter "rate"`,
		"discard://%zz":     "invalid sink URL",
	} {
		_, err := discard.ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: discard:"), err.Error())
	}
}

func BenchmarkSend(b *testing.B) {
	s, err := discard.New(discard.Config{}, nil)
	require.NoError(b, err)
	batch := make([]sinks.Message, 500)
	for i := range batch {
		batch[i] = sinktest.Msg("t", fmt.Sprint(i%1000), int64(i), make([]byte, 200))
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Send(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}
