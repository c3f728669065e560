package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// wakeHooks records what relay.Hooks.Wakeup reports.
type wakeHooks struct {
	relay.NopHooks
	mu        sync.Mutex
	source    string
	fallbacks int
	err       error // the last fallback's
}

func (h *wakeHooks) Wakeup(source string, fallback bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.source = source
	if fallback {
		h.fallbacks++
		h.err = err
	}
}

func (h *wakeHooks) lastErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *wakeHooks) get() (string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.source, h.fallbacks
}

// idleConfig is a relay whose workers never poll within a test: only a
// wake-up makes them claim.
func idleConfig(e *env, wakeup string, h *wakeHooks) relay.Config {
	cfg := e.config()
	cfg.PollInterval = time.Hour
	cfg.Wakeup = wakeup
	cfg.WatchInterval = 50 * time.Millisecond
	cfg.Hooks = h
	return cfg
}

// wakeBound is how soon an idle relay must deliver a write: far below the
// workers' PollInterval (an hour), generous for a loaded machine.
const wakeBound = 10 * time.Second

func waitSource(t *testing.T, h *wakeHooks, want string) {
	t.Helper()
	eventually(t, wakeBound, func() bool { s, _ := h.get(); return s == want }, "wake-up source %q", want)
}

// deliveredWithin waits for r's watcher to go idle (it backed off, and the
// workers it woke are done), writes one message and waits for the sink to
// hold n.
func (e *env) deliveredWithin(r *relay.Relay, sink *memory.Sink, n int, key string) {
	e.t.Helper()
	awaitNext(e.t, r, relay.SigWatcherIdle)
	e.write(msg("wake", key, "x"))
	eventually(e.t, wakeBound, func() bool { return sink.Len() >= n }, "message %d delivered to an idle relay", n)
}

func TestWakeupPollIdleRelayWakes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{relay.WakeupPoll, relay.WakeupAuto} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			h := &wakeHooks{}
			r, _ := e.start(idleConfig(e, mode, h), e.sink)
			eventually(t, wakeBound, func() bool { s, _ := h.get(); return s == "poll" || s == "wal" }, "a watcher")
			for i := 1; i <= 3; i++ {
				e.deliveredWithin(r, e.sink, i, "k")
			}
		})
	}
}

// At low rates a write costs one claim transaction, of the lane the
// watcher named: a claim that found fewer rows than a batch does not come
// straight back for an empty second look (it did: two claims a message,
// half of them empty).
func TestOneClaimPerWakeAtLowRates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := &wakeHooks{}
	r, _ := e.start(idleConfig(e, relay.WakeupPoll, h), e.sink)
	waitSource(t, h, "poll")
	e.deliveredWithin(r, e.sink, 1, "k0") // past the start-up's wake-ups
	awaitNext(t, r, relay.SigWatcherIdle)
	before := r.Stats()
	const n = 8
	for i := 2; i <= n+1; i++ {
		e.deliveredWithin(r, e.sink, i, fmt.Sprint("k", i))
	}
	awaitNext(t, r, relay.SigWatcherIdle)
	after := r.Stats()
	claims := after.Claims - before.Claims
	require.LessOrEqual(t, claims, int64(n+2), "claim transactions for %d messages written one at a time", n)
	require.GreaterOrEqual(t, claims, int64(n))
	// And each visits the lane the watcher named, not all 128 of its
	// worker's.
	// (A worker still visits all of its lanes once a second while it is
	// woken: about every third claim here.)
	require.GreaterOrEqual(t, after.LaneClaims-before.LaneClaims, int64(n/2), "claims of the woken lanes only, of %d claims", claims)
}

func TestWakeupWatcherHandsOver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ha, hb := &wakeHooks{}, &wakeHooks{}
	ra, stopA := e.start(idleConfig(e, relay.WakeupPoll, ha), e.sink)
	waitSource(t, ha, "poll")
	rb, _ := e.start(idleConfig(e, relay.WakeupPoll, hb), e.sink)
	waitSource(t, hb, "follow")
	// B's lanes are woken by A's NOTIFY: write to many keys so both own some.
	balanced(t, ra, rb)
	for i := range 8 {
		e.write(msg("wake", string(rune('a'+i)), "x"))
	}
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 8 }, "8 messages delivered by A and B")

	stopA() // the watcher goes: its session, and the lock with it
	waitSource(t, hb, "poll")
	e.deliveredWithin(rb, e.sink, 9, "k")
}

func TestWakeupNotifyEnablesTrigger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := &wakeHooks{}
	r, _ := e.start(idleConfig(e, relay.WakeupNotify, h), e.sink)
	waitSource(t, h, "notify")
	var on bool
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'messages_notify'`,
		e.table("messages")).Scan(&on))
	require.True(t, on, "notify mode enables the writers' trigger")
	e.deliveredWithin(r, e.sink, 1, "k")
}

func TestMigrationDisablesNotifyTrigger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	trigger := func() string {
		var s string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT tgenabled FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'messages_notify'`, e.table("messages")).Scan(&s))
		return s
	}
	require.Equal(t, "D", trigger(), "writers pay no NOTIFY by default")
	require.NoError(t, migrations.SetWakeup(ctx, e.pool, e.schema, "notify"))
	require.Equal(t, "O", trigger())
	require.NoError(t, migrations.SetWakeup(ctx, e.pool, e.schema, "auto"))
	require.Equal(t, "D", trigger())
	require.ErrorContains(t, migrations.SetWakeup(ctx, e.pool, e.schema, "sometimes"), "wakeup")
}

func TestWakeupConfigValidation(t *testing.T) {
	t.Parallel()
	err := relay.Config{Wakeup: "push"}.WithDefaults().Validate()
	require.ErrorContains(t, err, "wakeup")
	err = relay.Config{WatchInterval: time.Microsecond}.WithDefaults().Validate()
	require.ErrorContains(t, err, "watch-interval")
}

// TestWakeupWAL runs on a throwaway cluster with wal_level = logical: the
// watcher follows the WAL through a temporary slot, falls back to polling
// when the stream breaks, and leaves no slot behind.
func TestWakeupWAL(t *testing.T) {
	t.Parallel()
	wr := startWALRelay(t)
	e, pool, h, r, stop, w := wr.env, wr.pool, wr.h, wr.r, wr.stop, wr.w
	ctx := context.Background()
	var pub bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, migrations.Publication(e.schema)).Scan(&pub))
	require.True(t, pub, "migrate creates the publication where wal_level = logical")
	slots := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&n))
		return n
	}
	eventually(t, wakeBound, func() bool { return slots() == 1 }, "one replication slot")
	var temporary bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT temporary FROM pg_replication_slots`).Scan(&temporary))
	require.True(t, temporary, "the slot is temporary")
	for i := 1; i <= 3; i++ {
		e.deliveredWithin(r, e.sink, i, "k")
	}

	// Break the stream: the watcher polls (and says so), then follows the
	// WAL again.
	_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'outbox-relay-wal'`)
	require.NoError(t, err)
	eventually(t, wakeBound, func() bool { _, f := h.get(); return f >= 1 }, "a fallback reported")
	e.deliveredWithin(r, e.sink, 4, "k")
	waitSource(t, h, "wal")
	e.deliveredWithin(r, e.sink, 5, "k")

	// A writer's transaction that took its id before a later row was
	// seen, and committed after the looks stopped looking for that id: the
	// stream's report names the row's id, and the watcher looks for it.
	early, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer early.Rollback(ctx) //nolint:errcheck
	require.NoError(t, w.Write(ctx, early, msg("wake", "early", "taken first, committed 1.5 s later")))
	e.deliveredWithin(r, e.sink, 6, "k")
	r.AdvanceWatchClock(1500 * time.Millisecond) // past the watcher's gap window (1 s)
	require.NoError(t, early.Commit(ctx))
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 7 }, "the row of a transaction committed 1.5 s after a later id was seen")

	stop()
	// The server drops a temporary slot when its session has ended, a
	// moment after the relay closed it.
	eventually(t, wakeBound, func() bool { return slots() == 0 }, "no slot (no WAL retained) once the relay is gone")
}

// A publication that publishes nothing of the outbox (DROP SCHEMA leaves
// the publication behind, empty, and a schema created again under the
// same name found it "existing"): the relay polls and says why, instead
// of waiting on a stream that carries no row (its workers then waited for
// their safety poll), and migrate puts the table back.
func TestWakeupWALPublicationWithoutTheTable(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerConf(t, "wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4")
	pool, schema := srv.Schema(t)
	ctx := context.Background()
	pub := migrations.Ident(migrations.Publication(schema))
	_, err := pool.Exec(ctx, `ALTER PUBLICATION `+pub+` DROP TABLE `+migrations.Ident(schema)+`.messages`)
	require.NoError(t, err)
	published := func() bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = 'messages')`,
			migrations.Publication(schema), schema).Scan(&ok))
		return ok
	}
	require.False(t, published())

	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	e := &env{t: t, pool: pool, schema: schema, w: w, sink: memory.New()}
	h := &wakeHooks{}
	r, stop := startOn(t, srv.URL(), idleConfig(e, relay.WakeupWAL, h), e.sink)
	eventually(t, wakeBound, func() bool { _, f := h.get(); return f >= 1 }, "a fallback reported")
	require.ErrorContains(t, h.lastErr(), "does not publish")
	waitSource(t, h, "poll")
	e.deliveredWithin(r, e.sink, 1, "k")
	stop()

	_, err = migrations.Apply(ctx, pool, schema)
	require.NoError(t, err)
	require.True(t, published(), "migrate adds the outbox's table to its publication again")
}

// startOn runs a relay on the server at url until the test ends or stop.
func startOn(t *testing.T, url string, cfg relay.Config, sink sinks.Sink) (_ *relay.Relay, stop func()) {
	t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: url, Workers: cfg.Workers})
	require.NoError(t, err)
	r, err := relay.New(pool, sink, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
			pool.Close()
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// The watcher wakes the workers for what its look for new ids cannot see,
// so that the workers' own poll (an hour here) is only a safety net.

// A transaction that took its id before another one's and commits after
// it: the watcher had already seen the higher id, and looks for the gap.
func TestWakeupOutOfOrderCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := &wakeHooks{}
	r, _ := e.start(idleConfig(e, relay.WakeupPoll, h), e.sink)
	waitSource(t, h, "poll")
	e.deliveredWithin(r, e.sink, 1, "k0")

	ctx := context.Background()
	early, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer early.Rollback(ctx) //nolint:errcheck
	require.NoError(t, e.w.Write(ctx, early, msg("wake", "early", "taken first, committed last")))
	e.write(msg("wake", "late", "taken last, committed first"))
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 2 }, "the later id delivered")
	awaitNext(t, r, relay.SigWatcherIdle) // the worker is idle again
	require.NoError(t, early.Commit(ctx))
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 3 }, "the earlier id, committed after the watcher saw the later one, delivered")
}

// A retry and a delayed message come due with no new row to wake anyone.
func TestWakeupRowsThatComeDue(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{relay.WakeupPoll, relay.WakeupNotify} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			h := &wakeHooks{}
			cfg := idleConfig(e, mode, h)
			// Longer than the watcher's regular look for due rows (a
			// second): the look must also find when the next one is due.
			cfg.RetryInitial, cfg.RetryMax = 1500*time.Millisecond, 1500*time.Millisecond
			var failed atomic.Bool
			e.sink.SetFail(func(m sinks.Message) error {
				if string(m.Payload) == "fails once" && failed.CompareAndSwap(false, true) {
					return errors.New("503 once")
				}
				return nil
			})
			r, _ := e.start(cfg, e.sink)
			waitSource(t, h, map[string]string{relay.WakeupPoll: "poll", relay.WakeupNotify: "notify"}[mode])
			e.deliveredWithin(r, e.sink, 1, "k0")

			start := time.Now()
			e.write(msg("wake", "retried", "fails once"))
			eventually(t, wakeBound, func() bool { return e.sink.Len() == 2 }, "the retry delivered when due")
			took := time.Since(start)
			require.GreaterOrEqual(t, took, time.Second, "delivered before its retry was due")

			m := msg("wake", "delayed", "later")
			m.DeliverAfter = 700 * time.Millisecond
			start = time.Now()
			e.write(m)
			eventually(t, wakeBound, func() bool { return e.sink.Len() == 3 }, "the delayed message delivered when due")
			require.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond, "delivered before it was due")
		})
	}
}

// The fan-out router's copies wake the destinations' workers (the
// deliveries_notify trigger, in the router's transaction), which the new
// outbox rows woke before the copies existed.
func TestWakeupFanOutCopies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	router, kcfg, hcfg := e.fanOutConfigs()
	for _, c := range []*relay.Config{&router, &kcfg, &hcfg} {
		c.PollInterval = time.Hour
		c.Wakeup = relay.WakeupPoll
	}
	ksink, hsink := memory.New(), memory.New()
	rk, _ := e.start(kcfg, ksink)
	rh, _ := e.start(hcfg, hsink)
	// The destinations are woken by the new rows and find no copies; the
	// router starts after that, so only its copies' commit can wake them.
	awaitNextOfAny(t, relay.SigWatcherIdle, rk, rh)
	for i := range 3 {
		e.write(msg("orders.created", fmt.Sprint("o", i), "x"))
	}
	awaitNextOfAny(t, relay.SigWatcherIdle, rk, rh)
	require.Zero(t, ksink.Len()+hsink.Len())
	e.start(router, nil)
	eventually(t, wakeBound, func() bool { return ksink.Len() == 3 && hsink.Len() == 3 }, "copies delivered to both destinations")
}

// A watcher that takes over wakes everyone once: rows written while no
// process watched are older than the newest id it starts from.
func TestWakeupNewWatcherWakesForRowsWrittenUnwatched(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// This session plays a watcher, so that the relay starts as a follower.
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	const watcherLock = 0x6f757477 // internal/store's watcherLockKey
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, watcherLock, e.schema).Scan(new(any)))
	h := &wakeHooks{}
	r, _ := e.start(idleConfig(e, relay.WakeupPoll, h), e.sink)
	waitSource(t, h, "follow")
	// The relay idle: it took its lanes (and woke its workers for them),
	// and its LISTEN session tried the watcher's lock once more since.
	r.AwaitSignal(t, wakeBound, relay.SigBalanced, 0, nil)
	awaitNext(t, r, relay.SigFollowing)
	e.write(msg("wake", "unwatched", "written while nobody watched"))
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, watcherLock, e.schema)
	require.NoError(t, err)
	waitSource(t, h, "poll")
	eventually(t, wakeBound, func() bool { return e.sink.Len() == 1 }, "the row written before the relay became the watcher delivered")
}

// A watcher with nobody to wake sends no wake-ups (each is a transaction
// of its own): a session that merely LISTENs, as no relay does, hears
// nothing while the relay delivers. A listener that joins (a relay, or
// ListenConfig) is woken from its first write on; once it has gone, the
// watcher goes quiet again.
func TestWakeupLoneWatcherSendsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := &wakeHooks{}
	r, _ := e.start(idleConfig(e, relay.WakeupPoll, h), e.sink)
	waitSource(t, h, "poll")

	ctx := context.Background()
	spy, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer spy.Close(ctx)
	_, err = spy.Exec(ctx, "LISTEN "+ident.Quote(ident.Channel(e.schema)))
	require.NoError(t, err)
	// wakeUps counts the wake-ups the spy heard until quiet has passed
	// without one (other payloads: membership, listeners, are not).
	wakeUps := func(quiet time.Duration) int {
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, quiet)
			got, err := spy.WaitForNotification(wctx)
			cancel()
			if err != nil {
				require.ErrorIs(t, wctx.Err(), context.DeadlineExceeded, "spy: %v", err)
				return n
			}
			if got.Payload == "" || strings.HasPrefix(got.Payload, "lanes:") {
				n++
			}
		}
	}

	wakeUps(500 * time.Millisecond) // the start-up's
	for i := 1; i <= 3; i++ {
		e.deliveredWithin(r, e.sink, i, fmt.Sprint("alone", i))
	}
	require.Zero(t, wakeUps(300*time.Millisecond), "wake-ups sent by a relay that is alone")

	lctx, stopListener := context.WithCancel(ctx)
	var woken atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		relay.ListenConfig(lctx, e.pool, relay.Config{Schema: e.schema, Logger: testLogger(t)}, func() { woken.Add(1) }, nil)
	}()
	eventually(t, wakeBound, func() bool { return woken.Load() > 0 }, "the listener's own wake-up at its start")
	before := woken.Load()
	e.deliveredWithin(r, e.sink, 4, "joined")
	eventually(t, wakeBound, func() bool { return woken.Load() > before }, "the listener woken by the watcher for a new row")
	require.NotZero(t, wakeUps(300*time.Millisecond), "wake-ups once a listener joined")

	stopListener()
	<-done
	r.AdvanceWatchClock(1500 * time.Millisecond) // past the watcher's next check of the listeners
	wakeUps(300 * time.Millisecond)
	e.deliveredWithin(r, e.sink, 5, "alone again")
	e.deliveredWithin(r, e.sink, 6, "alone again")
	require.Zero(t, wakeUps(300*time.Millisecond), "wake-ups once the listener has gone")

	// A relay of another process that does not join the listeners (an
	// older release) is found in the relays table when it says it came.
	// (Registered from the spy's session, which stays alive: a relay
	// whose session is gone is reaped at once.)
	_, err = spy.Exec(ctx, "INSERT INTO "+e.table("relays")+` (id, hostname, pid, version, backend_pid, backend_start)
		SELECT 'older', 'elsewhere', 1, 'v0', pg_backend_pid(), a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, "SELECT pg_notify($1, 'members')", ident.Channel(e.schema))
	require.NoError(t, err)
	e.deliveredWithin(r, e.sink, 7, "older")
	require.NotZero(t, wakeUps(300*time.Millisecond), "wake-ups once a relay of another process registered")
}
