package adminhttp_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/adminhttp"
)

// healthy answers both probes with ok.
type healthy struct{}

func (healthy) Live() error                 { return nil }
func (healthy) Ready(context.Context) error { return nil }

// TestPprofOptIn: the runtime's profiles are served only with WithPprof
// (run --pprof).
func TestPprofOptIn(t *testing.T) {
	t.Parallel()
	get := func(t *testing.T, opts ...adminhttp.Option) int {
		srv, err := adminhttp.Start("127.0.0.1:0", prometheus.NewRegistry(), healthy{}, slog.New(slog.DiscardHandler), nil, opts...)
		require.NoError(t, err)
		defer srv.Close(context.Background())
		resp, err := http.Get("http://" + srv.Addr() + "/debug/pprof/cmdline")
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNotFound, get(t), "without --pprof")
	require.Equal(t, http.StatusOK, get(t, adminhttp.WithPprof()), "with --pprof")
}
