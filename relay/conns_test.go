package relay_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// withAppName returns the database URL u with application_name set.
func withAppName(t *testing.T, u, name string) string {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	q := pu.Query()
	q.Set("application_name", name)
	pu.RawQuery = q.Encode()
	return pu.String()
}

// connCounter samples how many sessions carry an application_name, and
// keeps the highest count.
type connCounter struct {
	peak atomic.Int64
	stop func()
}

func countConns(t *testing.T, pool *pgxpool.Pool, appName string) *connCounter {
	t.Helper()
	c := &connCounter{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A sampler: it looks every few milliseconds by design.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n); err == nil {
				c.peak.Store(max(c.peak.Load(), n))
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	c.stop = func() { cancel(); <-done }
	t.Cleanup(c.stop)
	return c
}

// TestProcessStaysWithinMaxConns: a relay whose workers are busy, while
// health checks hammer the pool, never has more sessions on the server
// than its pool's MaxConns, here the least it needs (2 workers, lease,
// LISTEN), and still delivers. Before the fix, the lane lease and LISTEN
// connections were hijacked out of the pool, which then opened two more
// in their place: 6 sessions for a pool of 4.
func TestProcessStaysWithinMaxConns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	app := "conns-" + e.schema
	cfg := e.config()
	cfg.Workers = 2
	cfg.BatchSize = 10
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: withAppName(t, pgtest.URL(), app),
		Workers: cfg.Workers, MaxConns: relay.Conns(cfg)})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	limit := int64(pool.Config().MaxConns)
	require.EqualValues(t, 4, limit)

	var msgs []outbox.Message
	for i := 0; i < 400; i++ {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%40), "x"))
	}
	e.write(msgs...)
	sink := memory.New()
	sink.SetDelay(20 * time.Millisecond) // workers hold their connections while publishing
	r, err := relay.New(pool, sink, cfg)
	require.NoError(t, err)
	counter := countConns(t, e.pool, app)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	// Health checks and metrics take what connections they can get.
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, time.Second)
				_ = r.Ready(rctx)
				rcancel()
			}
		}()
	}
	require.NoError(t, sink.WaitFor(waitCtx(t, 60*time.Second), len(msgs)))
	cancel()
	wg.Wait()
	require.NoError(t, <-done)
	counter.stop()
	t.Logf("pool MaxConns %d, peak sessions %d", limit, counter.peak.Load())
	require.LessOrEqual(t, counter.peak.Load(), limit, "sessions of one relay process")
}

func TestNewRefusesAPoolTooSmall(t *testing.T) {
	t.Parallel()
	cfg := relay.Config{Workers: 3}
	require.Equal(t, 5, relay.Conns(cfg), "3 workers, lease, LISTEN")
	shared := cfg
	shared = relay.WithSharedListener(shared)
	require.Equal(t, 2*4+1, relay.Conns(shared, shared), "two relays sharing one LISTEN")

	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = relay.New(pool, memory.New(), cfg)
	require.ErrorContains(t, err, "max-conns: 3 workers need a pool of at least 5 connections (one each, the lane lease and LISTEN), have 4")
	_, err = relay.New(pool, memory.New(), shared)
	require.NoError(t, err, "with a shared LISTEN, 4 will do")
}

// A relay stopped while its start-up queries wait (for the database, or
// for a connection of a capped pool) returns nil like any stopped relay:
// the CLI exited 1 on SIGTERM in that window ("look for fan-out copies of
// route …: context canceled").
func TestStopDuringStartReturnsNil(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, cfg := range []relay.Config{e.config(), func() relay.Config {
		c := e.config()
		c.Route = "orders" // a named route looks for leftover fan-out copies at start
		return c
	}()} {
		pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: cfg.Workers})
		require.NoError(t, err)
		r, err := relay.New(pool, memory.New(), cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, r.Run(ctx))
		pool.Close()
	}
}
