package wake

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// The polling watcher's gaps: ids missing below the newest it saw, looked
// for again until found, expired, or pushed out by newer ones.
func TestGapList(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var g gapList
	g.add(10, []int64{11, 14, 15, 17}, now)
	if got := g.ids(now); !slices.Equal(got, []int64{12, 13, 16}) {
		t.Fatalf("gaps after 10 → 11,14,15,17: %v, want 12 13 16", got)
	}
	g.fill([]int64{13})
	if got := g.ids(now); !slices.Equal(got, []int64{12, 16}) {
		t.Fatalf("after 13 was found: %v, want 12 16", got)
	}
	if got := g.ids(now.Add(gapTTL)); len(got) != 0 {
		t.Fatalf("gaps outlived gapTTL: %v", got)
	}
	g = nil
	g.add(0, []int64{1000}, now) // a jump: only the newest maxGaps below it
	got := g.ids(now)
	if len(got) != maxGaps || got[0] != 1000-maxGaps || got[len(got)-1] != 999 {
		t.Fatalf("after a jump to 1000: %d gaps from %d to %d, want %d from %d to 999", len(got), got[0], got[len(got)-1], maxGaps, 1000-maxGaps)
	}
	g.add(1000, []int64{1002}, now) // newer gaps push out the oldest
	got = g.ids(now)
	if len(got) != maxGaps || got[len(got)-1] != 1001 || slices.Contains(got, 1000-maxGaps) {
		t.Fatalf("the newest gap 1001 kept and the oldest dropped: %v", got)
	}
}

// New names each field it refuses, and fills in the optional ones.
func TestOnGrid(t *testing.T) {
	d := 100 * time.Millisecond
	for _, t0 := range []time.Time{
		time.Now(),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),                        // on the grid: the next point
		time.Date(2026, 1, 2, 3, 4, 5, int(99*time.Millisecond), time.UTC), // a moment before one
	} {
		at := onGrid(t0, d)
		require.True(t, at.After(t0), "%v: %v is not after it", t0, at)
		require.LessOrEqual(t, at.Sub(t0), d, "%v: %v is farther than one step", t0, at)
		require.True(t, at.Equal(at.Truncate(d)), "%v: %v is not on the grid", t0, at)
	}
	// Two sources' looks, 37 ms apart, meet on the grid.
	a := time.Now()
	require.True(t, onGrid(a, d).Equal(onGrid(a.Add(37*time.Millisecond), d)) ||
		onGrid(a, d).Add(d).Equal(onGrid(a.Add(37*time.Millisecond), d)))
	// The monotonic clock is kept: the point is a time.Now's, not a wall
	// clock's.
	require.Contains(t, onGrid(a, d).String(), "m=+")
}

func TestNewNamesTheField(t *testing.T) {
	t.Parallel()
	// A pool that never connects: New does no I/O.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	defer pool.Close()
	_, err = New(Config{Mode: "sometimes", WatchInterval: time.Microsecond})
	for _, field := range []string{"pool", "mode", "watch-interval", "heartbeat", "wake"} {
		require.ErrorContains(t, err, "outbox: wake: "+field+":")
	}
	_, err = New(Config{Pool: pool, Schema: string([]byte{'a', 0}), WatchInterval: time.Second, Heartbeat: time.Second, Wake: func(lanes.Set) {}})
	require.ErrorContains(t, err, "outbox: schema:")
	k, err := New(Config{Pool: pool, WatchInterval: time.Second, Heartbeat: time.Second, Wake: func(lanes.Set) {}})
	require.NoError(t, err)
	require.Equal(t, ModeAuto, k.cfg.Mode)
	require.Equal(t, ident.DefaultSchema, k.s.Name())
	require.NotNil(t, k.cfg.Logger)
	require.NotNil(t, k.cfg.Hooks)
	require.NotNil(t, k.cfg.Members)
}

// sources records what the hooks heard.
type sources struct {
	mu   sync.Mutex
	seen []string
}

func (s *sources) Wakeup(source string, _ bool, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, source)
}

func (s *sources) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// A Waker alone on its schema becomes the watcher, wakes every lane once
// (rows written before it watched), then the lane of a row committed
// while it polls. It runs once; TestMain checks that Stop ended it.
func TestWakerWakesTheLaneOfANewRow(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	bus := testsig.New()
	hooks := &sources{}
	var mu sync.Mutex
	var all int
	var named lanes.Set
	k, err := New(Config{
		Pool: pool, Schema: schema, Mode: ModePoll, WatchInterval: 20 * time.Millisecond, Heartbeat: time.Second,
		Logger: testkit.Logger(t, slog.LevelDebug), Hooks: hooks, Signals: bus,
		Wake: func(ls lanes.Set) {
			mu.Lock()
			defer mu.Unlock()
			if ls.Empty() {
				all++
			}
			named.Union(ls)
		},
	})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	defer k.Stop()
	require.ErrorIs(t, k.Start(ctx), service.ErrStarted)

	await := func(sig testsig.Signal) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := bus.Await(actx, sig, 0, nil)
		require.NoError(t, err, "signal %s", sig)
	}
	await(testsig.Elected)
	// Idle: its first look has set the baseline the next ones start from.
	await(testsig.WatcherIdle)
	mu.Lock()
	require.Positive(t, all, "every lane woken at the start")
	mu.Unlock()
	require.Equal(t, []string{"poll"}, hooks.get())

	var lane int16
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+ident.Quote(schema)+".messages (topic, key, payload) VALUES ('t', 'k', 'x') RETURNING lane").Scan(&lane))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return named.Has(int(lane))
	}, 10*time.Second, 5*time.Millisecond, "lane %d woken", lane)

}

// Following the WAL alone, the watcher wakes the lane of a reported row
// straight from the stream, without a look for it; it looks only when no
// claim of its process returned the row in time (the claim looked before
// the writer's transaction was visible, say), and then wakes the lane
// again.
func TestWakerWakesReportedLanesWithoutALook(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerConf(t, "wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4")
	pool, schema := srv.Schema(t)
	ctx := context.Background()
	bus := testsig.New()
	var mu sync.Mutex
	var woken []lanes.Set
	var written []int64
	claim := true
	var k *Waker
	k, err := New(Config{
		Pool: pool, Schema: schema, Mode: ModeWAL, WatchInterval: time.Hour, Heartbeat: time.Second,
		Logger: testkit.Logger(t, slog.LevelDebug), Signals: bus,
		Wake: func(ls lanes.Set) {
			mu.Lock()
			defer mu.Unlock()
			woken = append(woken, ls)
			if claim && !ls.Empty() {
				// What the relay's workers do: claim, and say what.
				k.Claimed(slices.Values(written))
			}
		},
	})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	defer k.Stop()
	await := func(sig testsig.Signal, after int) int {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := bus.Await(actx, sig, after, nil)
		require.NoError(t, err, "signal %s", sig)
		return n
	}
	await(testsig.WAL, 0)
	await(testsig.CaughtUp, 0) // no look pending: the next ones follow reports
	await(testsig.WatcherIdle, 0)
	// write commits a row, its id known to the "claims" before the
	// commit (the stream may report it before the INSERT returns).
	write := func(key string) (lane int16) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, "INSERT INTO "+ident.Quote(schema)+".messages (topic, key, payload) VALUES ('t', $1, 'x') RETURNING id, lane", key).Scan(&id, &lane); err != nil {
				return err
			}
			mu.Lock()
			written = append(written, id)
			mu.Unlock()
			return nil
		}))
		return lane
	}
	// wokenFor: lane woken times since the mark.
	mark := 0
	wokenFor := func(lane int16, times int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, ls := range woken[mark:] {
				if ls.Has(int(lane)) {
					n++
				}
			}
			return n >= times
		}
	}

	looks := bus.Count(testsig.FoundRows)
	for _, key := range []string{"a", "b", "c"} {
		require.Eventually(t, wokenFor(write(key), 1), 10*time.Second, time.Millisecond, "lane of key %s woken", key)
	}
	idle := bus.Count(testsig.WatcherIdle)
	await(testsig.WatcherIdle, idle) // past walClaimWait: a miss would have looked
	require.Equal(t, looks, bus.Count(testsig.FoundRows), "looks for rows that claims returned")
	require.Zero(t, bus.Count(testsig.WALMissed))

	mu.Lock()
	claim, mark = false, len(woken)
	mu.Unlock()
	lane := write("d")
	await(testsig.WALMissed, 0)
	await(testsig.FoundRows, looks)
	require.Eventually(t, wokenFor(lane, 2), 10*time.Second, time.Millisecond, "lane %d woken from the stream, then by the look", lane)
}

// A publication of an earlier migrate carries the id alone: the watcher
// says so once, and looks for each reported row before it wakes the
// row's lane, as it did then.
func TestWakerLooksWhereTheStreamCarriesNoKey(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerConf(t, "wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4")
	pool, schema := srv.Schema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "ALTER PUBLICATION "+ident.Quote(schema+"_relay")+" SET TABLE "+ident.Quote(schema)+".messages (id)")
	require.NoError(t, err)
	bus := testsig.New()
	var logs testkit.SyncBuffer
	var mu sync.Mutex
	var named lanes.Set
	k, err := New(Config{
		Pool: pool, Schema: schema, Mode: ModeWAL, WatchInterval: time.Hour, Heartbeat: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Signals: bus,
		Wake: func(ls lanes.Set) {
			mu.Lock()
			defer mu.Unlock()
			named.Union(ls)
		},
	})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	defer k.Stop()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = bus.Await(actx, testsig.WAL, 0, nil)
	require.NoError(t, err)
	_, err = bus.Await(actx, testsig.WatcherIdle, 0, nil)
	require.NoError(t, err)
	looks := bus.Count(testsig.FoundRows)
	var lane int16
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+ident.Quote(schema)+".messages (topic, key, payload) VALUES ('t', 'k', 'x') RETURNING lane").Scan(&lane))
	_, err = bus.Await(actx, testsig.FoundRows, looks, nil)
	require.NoError(t, err, "a look that found the reported row")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return named.Has(int(lane))
	}, 10*time.Second, time.Millisecond, "lane %d woken", lane)
	require.Zero(t, bus.Count(testsig.WALMissed), "nothing woken straight from the stream, nothing missed")
	require.Equal(t, 1, strings.Count(logs.String(), "carries no key"), "said once: %s", logs.String())
}
