// Package adminhttp serves the relay's admin endpoints: /metrics
// (Prometheus), /livez (the worker loops turn; no database access),
// /readyz (database reachable, not draining, a destination up: 200
// "degraded" when some routes' destinations are down and others are not)
// and, when one
// is given, the operator console (/api/v1 and /ui, package console).
package adminhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Checker is what the endpoints ask; *relay.Relay and *relay.Set
// implement it.
type Checker interface {
	Live() error
	Ready(ctx context.Context) error
}

// Degrader is a Checker that can be ready while part of its job is not
// done (*relay.Set: a route whose destination is down while others
// deliver). /readyz then answers 200 with "degraded" and the reasons.
// Readiness answers Ready's question and that one in one pass.
type Degrader interface {
	Readiness(ctx context.Context) (degraded string, err error)
}

// Server is a running admin listener.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Option adds to what the admin listener serves.
type Option func(mux *http.ServeMux)

// WithPprof serves the Go runtime's profiles (net/http/pprof) under
// /debug/pprof/. Off unless asked for (run --pprof): a profile costs the
// relay CPU while it is taken, and the listener has no authentication.
// A CPU profile may last up to the listener's write timeout (30s).
func WithPprof() Option {
	return func(mux *http.ServeMux) {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
}

// Start listens on addr and serves in the background. A non-nil console
// serves /api/ and /ui/ (and / redirects to /ui/).
func Start(addr string, gatherer prometheus.Gatherer, c Checker, log *slog.Logger, console http.Handler, opts ...Option) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("outbox: admin-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		answer(w, c.Live())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		d, ok := c.(Degrader)
		if !ok {
			answer(w, c.Ready(ctx))
			return
		}
		why, err := d.Readiness(ctx)
		if err == nil && why != "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			fmt.Fprintf(w, "degraded:\n%s\n", why)
			return
		}
		answer(w, err)
	})
	if console != nil {
		mux.Handle("/api/", console)
		mux.Handle("/ui/", console)
		mux.Handle("/ui", console)
		mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	}
	for _, o := range opts {
		o(mux)
	}
	s := &Server{ln: ln, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
	}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", "error", err)
		}
	}()
	return s, nil
}

// Addr is the address actually listened on (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the listener.
func (s *Server) Close(ctx context.Context) error { return s.srv.Shutdown(ctx) }

func answer(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Probe GETs path on the admin listener at addr (":9090" means this host)
// and returns nil for a 200 answer. It is what `outbox-relay healthcheck`
// runs in images without a shell.
func Probe(ctx context.Context, addr, path string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("outbox: admin-addr: %w", err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("outbox: %s: %w", url, err)
	}
	defer resp.Body.Close()
	body := make([]byte, 512)
	n, _ := resp.Body.Read(body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("outbox: %s: %s: %s", url, resp.Status, string(body[:n]))
	}
	return nil
}
