package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/builtin"
)

// relayProc is one outbox-relay process.
type relayProc struct {
	*testkit.Relay
	stderr *tailBuffer
	hwmKiB atomic.Int64 // last VmHWM read from /proc/<pid>/status
}

// startRelay starts `outbox-relay run` on schema with the given sink and
// extra flags. Its stdout goes to stdout (nil: discarded).
func (b *bench) startRelay(ctx context.Context, schema, sinkURL string, stdout io.Writer, extra ...string) (*relayProc, error) {
	// The bench's own environment (OUTBOX_* included) plus the database.
	env := append(os.Environ(), "DATABASE_URL="+b.cfg.databaseURL)
	return b.startRelayEnv(ctx, env, schema, sinkURL, stdout, extra...)
}

// startRelayEnv is startRelay with the process's whole environment.
func (b *bench) startRelayEnv(ctx context.Context, env []string, schema, sinkURL string, stdout io.Writer, extra ...string) (*relayProc, error) {
	args := []string{"run", "--schema", schema, "--log-level", "warn",
		"--workers", strconv.Itoa(b.cfg.workers), "--batch-size", strconv.Itoa(b.cfg.batch)}
	if path, ok := strings.CutPrefix(sinkURL, "config:"); ok {
		args = append(args, "--config", path) // a routes table
	} else {
		args = append(args, "--sink", sinkURL)
	}
	if b.adminFlag {
		// The admin listener defaults to :9090; several relays (and other
		// people's tests) would collide on it. Keep it on, on any port.
		args = append(args, "--admin-addr", "127.0.0.1:0")
	}
	args = append(args, extra...)
	p := &relayProc{stderr: &tailBuffer{max: 8 << 10}}
	r, err := testkit.StartRelay(ctx, testkit.RelayConfig{
		Bin: b.cfg.relayBin, Args: args, Env: env,
		Stdout: stdout, Stderr: p.stderr,
	})
	if err != nil {
		return nil, err
	}
	p.Relay = r
	go p.pollHWM()
	return p, nil
}

// pollHWM reads the process's VmHWM (peak RSS) every 10ms until it exits;
// the last value read is its peak up to at most 10ms before exit. (The
// rusage of the exited child is no good here: ru_maxrss of a child started
// with vfork+exec includes the parent's RSS at the time of the fork.)
func (p *relayProc) pollHWM() {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if _, hwm, err := p.Memory(); err == nil && hwm > 0 {
			p.hwmKiB.Store(hwm / 1024)
		}
		select {
		case <-p.Done():
			return
		case <-t.C:
		}
	}
}

// wait waits for the process to exit and returns its wall time and peak
// RSS (VmHWM) in MiB.
func (p *relayProc) wait(ctx context.Context, limit time.Duration) (time.Duration, float64, error) {
	select {
	case <-p.Done():
	case <-time.After(limit):
		p.stop()
		return 0, 0, fmt.Errorf("%w (%s); stderr: %s", errTimeLimit, limit, p.stderr)
	case <-ctx.Done():
		p.stop()
		return 0, 0, ctx.Err()
	}
	if err := p.Err(); err != nil {
		return 0, 0, fmt.Errorf("relay: %w; stderr: %s", err, p.stderr)
	}
	return p.Exited().Sub(p.Started()), float64(p.hwmKiB.Load()) / 1024, nil
}

// errTimeLimit says a drain was stopped at its time limit.
var errTimeLimit = errors.New("relay did not finish within its time limit")

// stop sends SIGTERM (graceful drain) and waits, killing the relay after
// 30s.
func (p *relayProc) stop() { _ = p.Stop() }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.b.String())
}

// drainResult is one timed drain.
type drainResult struct {
	elapsed time.Duration
	rssMiB  float64 // 0 when the relay ran in this process
	mode    string  // "binary" or "in-process"
}

// drain empties schema's outbox into sinkURL with the relay binary (`run
// --exit-when-empty`), or, when this build of the binary does not know the
// sink's scheme yet, with relay.New + Run in this process.
func (b *bench) drain(ctx context.Context, schema, sinkURL string, limit time.Duration) (drainResult, error) {
	scheme := sinks.Scheme(sinkURL)
	if b.cliSink[scheme] || strings.HasPrefix(sinkURL, "config:") {
		p, err := b.startRelay(ctx, schema, sinkURL, nil, "--exit-when-empty")
		if err != nil {
			return drainResult{}, err
		}
		el, rss, err := p.wait(ctx, limit)
		return drainResult{elapsed: el, rssMiB: rss, mode: "binary"}, err
	}
	sink, err := openSink(sinkURL)
	if err != nil {
		return drainResult{}, fmt.Errorf("sink %s: %w", scheme, err)
	}
	defer sink.Close(context.WithoutCancel(ctx))
	el, err := b.drainInProcess(ctx, schema, sink, nil, nil)
	return drainResult{elapsed: el, mode: "in-process"}, err
}

// drainInProcess runs relay.New + Run on schema until the outbox is empty,
// the way `run --exit-when-empty` does, and returns the wall time.
func (b *bench) drainInProcess(ctx context.Context, schema string, sink sinks.Sink, hooks relay.Hooks, tracer pgx.QueryTracer) (time.Duration, error) {
	start := time.Now()
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: b.cfg.databaseURL, Workers: b.cfg.workers})
	if err != nil {
		return 0, err
	}
	if tracer != nil {
		// Same settings as the relay's own pool, plus the tracer.
		pc := pool.Config()
		pool.Close()
		pc.ConnConfig.Tracer = tracer
		if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return 0, err
		}
	}
	defer pool.Close()
	r, err := relay.New(pool, sink, relay.Config{
		Schema: schema, Workers: b.cfg.workers, BatchSize: b.cfg.batch, Hooks: hooks,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	if _, err := b.waitEmpty(ctx, schema, 10*time.Minute); err != nil {
		cancel()
		<-errc
		return 0, err
	}
	cancel()
	if err := <-errc; err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// openSink opens a sink in this process from its --sink URL.
func openSink(raw string) (sinks.Sink, error) {
	d, ok := builtin.Registry.Lookup(sinks.Scheme(raw))
	if !ok {
		return nil, errors.New("no in-process opener for " + raw)
	}
	cfg, err := d.Parse(raw, nil)
	if err != nil {
		return nil, err
	}
	return cfg.Open(sinks.Env{Logger: slog.New(slog.DiscardHandler)})
}
