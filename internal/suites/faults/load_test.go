package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// writerConns decides how many concurrent writer connections the load test
// opens: 200 if the server allows, else what fits while leaving room for
// the rest of the suite (which runs in parallel with this package), or
// FAULTS_WRITERS.
func writerConns(t *testing.T, pool *pgxpool.Pool) (n int, why string) {
	var maxConns, inUse int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)`).Scan(&maxConns, &inUse))
	if v := os.Getenv("FAULTS_WRITERS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "FAULTS_WRITERS")
		return n, "FAULTS_WRITERS"
	}
	free := maxConns - inUse
	switch {
	case free-10 >= 200:
		n = 200
	case long():
		n = free - 20 // a throwaway server: leave 20 for the relay and stragglers
	default:
		n = free / 3 // the default run shares the server with other packages
	}
	n = max(n, 4)
	return n, fmt.Sprintf("max_connections allows %d non-superuser connections, %d in use", maxConns, inUse)
}

// TestWriteLoadDoesNotStarveRelay measures the relay's drain rate with no
// other load and with many writer connections committing single-message
// transactions as fast as they can. It reports the ratio; it asserts only
// that everything is delivered (timing depends on the machine and on what
// else runs). The long form takes every connection slot it can, which
// would lock everyone else out of the shared server, so it runs on a
// throwaway server of its own.
func TestWriteLoadDoesNotStarveRelay(t *testing.T) {
	databaseURL := pgtest.URL()
	var pool *pgxpool.Pool
	var schema string
	if long() {
		srv := pgtest.Server(t)
		databaseURL = srv.URL()
		pool, schema = srv.Schema(t)
	} else {
		pool, schema = pgtest.Schema(t)
	}
	ctx := context.Background()
	writers, why := writerConns(t, pool)
	p := startRelay(t, databaseURL, schema, "--sink", "discard")
	published := func() float64 {
		v, err := p.metric("outbox_relay_messages_published_total")
		if err != nil {
			return 0
		}
		return v
	}
	const chunk = 100_000
	// drain commits chunk messages at once and times how long the relay
	// takes to publish that many (whichever they are).
	drain := func() time.Duration {
		base := published()
		start := time.Now()
		bulkInsert(t, pool, schema, "bulk", chunk)
		eventually(t, 120*time.Second, 5*time.Millisecond, func() (bool, string) {
			return published() >= base+chunk, fmt.Sprintf("published %.0f of %d", published()-base, chunk)
		})
		return time.Since(start)
	}
	idle := drain()

	// The load: writers connections, each committing one message per
	// transaction in a loop.
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns, cfg.MinConns = int32(writers), int32(writers)
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer wpool.Close()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	var written, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d", i)
				err := func() error {
					tx, err := wpool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
					if err := w.Write(ctx, tx, outbox.Message{Topic: "load", Key: key, Payload: []byte(payloadOf("load", key, seq))}); err != nil {
						return err
					}
					return tx.Commit(ctx)
				}()
				if err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					continue
				}
				written.Add(1)
			}
		}()
	}
	// All connections busy: every writer committed.
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return written.Load() >= int64(writers)*10, fmt.Sprintf("the writers committed %d", written.Load())
	})
	w0, t0 := written.Load(), time.Now()
	loaded := drain()
	writeRate := float64(written.Load()-w0) / time.Since(t0).Seconds()
	close(stop)
	wg.Wait()

	total := float64(2*chunk) + float64(written.Load())
	eventually(t, 120*time.Second, 20*time.Millisecond, func() (bool, string) {
		return published() >= total && count(t, pool, schema, "messages") == 0,
			fmt.Sprintf("published %.0f of %.0f", published(), total)
	})
	require.Equal(t, total, published(), "every committed message published exactly once")
	require.Zero(t, failed.Load(), "writer transactions failed, the first with: %v", firstErr.Load())
	require.Empty(t, deadLetters(t, pool, schema))
	idleRate, loadedRate := chunk/idle.Seconds(), chunk/loaded.Seconds()
	t.Logf("%d writer connections (%s); writers committed %.0f tx/s (1 message each) during the loaded drain; "+
		"relay drain rate: %.0f msg/s idle, %.0f msg/s under write load: ratio %.2f",
		writers, why, writeRate, idleRate, loadedRate, loadedRate/idleRate)
}

// TestBacklogDrainMemoryFlat drains a large backlog (500k messages; 5M with
// FAULTS_LONG=1) and records the relay's memory as it goes: it must be
// bounded by the batch size, not the backlog.
func TestBacklogDrainMemoryFlat(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	n := 500_000
	if long() {
		n = 5_000_000
	}
	start := time.Now()
	bulkInsert(t, pool, schema, "backlog", n)
	inserted := time.Since(start)
	var dbBytes int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_total_relation_size($1::regclass)`, schema+".messages").Scan(&dbBytes))

	start = time.Now()
	p := startRelay(t, pgtest.URL(), schema, "--sink", "discard", "--exit-when-empty")
	type sample struct {
		at  time.Duration
		rss int64
	}
	var samples []sample
	var hwm int64
	// Sample every 100ms until the relay exits.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for p.Alive() {
		// VmHWM, not the exited child's rusage: ru_maxrss also counts the
		// test process's memory that the child shared between fork and
		// exec.
		if rss, h, err := p.memory(); err == nil {
			samples = append(samples, sample{time.Since(start), rss})
			hwm = max(hwm, h)
		}
		select {
		case <-p.Done():
		case <-tick.C:
		}
	}
	require.Equal(t, 0, p.wait(time.Second), p.logs.tail(20))
	took := time.Since(start)
	require.Zero(t, count(t, pool, schema, "messages"))
	require.Empty(t, deadLetters(t, pool, schema))
	require.NotEmpty(t, samples)
	// Flat: the second half of the drain uses no more memory than the
	// first half (plus allocator noise).
	var firstHalf, secondHalf int64
	for _, s := range samples {
		if s.at < took/2 {
			firstHalf = max(firstHalf, s.rss)
		} else {
			secondHalf = max(secondHalf, s.rss)
		}
	}
	t.Logf("%d messages (%d MB in the table, inserted in %s) drained in %s (%.0f msg/s incl. start-up); relay peak RSS (VmHWM) %d MB; "+
		"max RSS first half %d MB, second half %d MB (%d samples)",
		n, dbBytes>>20, inserted.Round(time.Millisecond), took.Round(time.Millisecond), float64(n)/took.Seconds(),
		hwm>>20, firstHalf>>20, secondHalf>>20, len(samples))
	require.Less(t, hwm, int64(100<<20), "relay memory must not grow with the backlog")
	require.LessOrEqual(t, secondHalf, firstHalf+16<<20, "memory grew during the drain")
}
