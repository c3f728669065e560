package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	w      *outbox.Writer
	sink   *memory.Sink
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	return &env{t: t, pool: pool, schema: schema, w: w, sink: memory.New()}
}

func (e *env) table(name string) string { return migrations.Ident(e.schema) + "." + name }

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// config is a fast-moving relay configuration for tests.
func (e *env) config() relay.Config {
	return relay.Config{
		Schema:       e.schema,
		Workers:      2,
		BatchSize:    50,
		PollInterval: 50 * time.Millisecond,
		RetryInitial: 10 * time.Millisecond,
		RetryMax:     50 * time.Millisecond,
		MaxAttempts:  5,
		LeaseTTL:     3 * time.Second,
		Heartbeat:    200 * time.Millisecond,
		Logger:       testLogger(e.t),
	}
}

// start runs a relay until the test ends (or stop is called) and returns
// a stop function that drains it.
func (e *env) start(cfg relay.Config, sink sinks.Sink) (*relay.Relay, func()) {
	e.t.Helper()
	r, stop := e.startOn(pgtest.URL(), cfg, sink)
	return r, func() { require.NoError(e.t, stop()) }
}

func (e *env) write(msgs ...outbox.Message) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(e.t, err)
	require.NoError(e.t, e.w.Write(ctx, tx, msgs...))
	require.NoError(e.t, tx.Commit(ctx))
}

func msg(topic, key string, payload string) outbox.Message {
	return outbox.Message{Topic: topic, Key: key, Payload: []byte(payload)}
}

func (e *env) count(table string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table(table)).Scan(&n))
	return n
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	testkit.Eventually(t, d, 10*time.Millisecond, func() (bool, string) { return cond(), fmt.Sprintf(format, args...) })
}

// signalBound is how long a test waits for a relay's signal: generous
// for a loaded machine.
const signalBound = 20 * time.Second

// awaitNext waits for r's next announcement of sig from now on, and
// returns its value.
func awaitNext(t testing.TB, r *relay.Relay, sig relay.Signal) int {
	t.Helper()
	return r.AwaitSignal(t, signalBound, sig, r.SignalCount(sig), nil)
}

// awaitNextOfAny waits for the next announcement of sig from now on by
// any of rs.
func awaitNextOfAny(t testing.TB, sig relay.Signal, rs ...*relay.Relay) {
	t.Helper()
	marks := make([]int, len(rs))
	for i, r := range rs {
		marks[i] = r.SignalCount(sig)
	}
	eventually(t, signalBound, func() bool {
		for i, r := range rs {
			if r.SignalCount(sig) > marks[i] {
				return true
			}
		}
		return false
	}, "a %q signal from any of %d relays", sig, len(rs))
}

// balanced waits until each of rs has had a heartbeat that left it at an
// equal share of the lanes, handing nothing over.
func balanced(t testing.TB, rs ...*relay.Relay) {
	t.Helper()
	share := func(v int) bool { return v == 256/len(rs) }
	for _, r := range rs {
		r.AwaitSignal(t, signalBound, relay.SigBalanced, 0, share)
	}
}

// claimedAgain waits until r's workers have claimed at least n more times
// from now on (empty claims too): what a claim would take, it has had
// the chance to.
func claimedAgain(t testing.TB, r *relay.Relay, n int64) {
	t.Helper()
	from := r.Stats().Claims
	eventually(t, signalBound, func() bool { return r.Stats().Claims >= from+n }, "%d more claims", n)
}

// refuseWhileDown makes s refuse every message as a destination that is
// down (a refused connection: not sent) until the returned switch is
// set to false; it starts down.
func refuseWhileDown(s *memory.Sink) *atomic.Bool {
	down := new(atomic.Bool)
	down.Store(true)
	s.SetFail(func(sinks.Message) error {
		if down.Load() {
			return sinks.NotSent(errors.New("connection refused"))
		}
		return nil
	})
	return down
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// checkOrder asserts that, per key, first deliveries are in write (Seq)
// order and that any message seen again is a re-delivery of one already
// delivered.
func checkOrder(t *testing.T, delivered []sinks.Message) {
	t.Helper()
	last := map[string]int64{}
	seen := map[int64]bool{}
	for _, m := range delivered {
		if seen[m.Seq] {
			continue
		}
		seen[m.Seq] = true
		if m.Key == "" {
			continue
		}
		require.Greater(t, m.Seq, last[m.Key], "key %q: message %d delivered after %d", m.Key, m.Seq, last[m.Key])
		last[m.Key] = m.Seq
	}
}

func TestDeliversEverythingOnceInKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 3000
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k%d", i%37)
		if i%10 == 0 {
			key = "" // some keyless messages
		}
		msgs = append(msgs, msg("orders", key, fmt.Sprint(i)))
	}
	e.write(msgs[:n/2]...)
	cfg := e.config()
	cfg.Workers = 4
	e.start(cfg, e.sink)
	e.write(msgs[n/2:]...)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), n))
	eventually(t, 10*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not empty")

	got := e.sink.Delivered()
	require.Len(t, got, n, "nothing fails, so nothing is delivered twice")
	ids := map[string]bool{}
	for _, m := range got {
		require.False(t, ids[m.ID], "message %s delivered twice", m.ID)
		ids[m.ID] = true
		require.Equal(t, 1, m.Attempt)
	}
	checkOrder(t, got)
	require.Empty(t, e.sink.Violations())
}

func TestTwoRelaysShareLanesAndKeepKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	r1, r2, _ := e.startBalanced(t, cfg, 10*time.Second)

	const n = 4000
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%50), fmt.Sprint(i)))
	}
	for i := 0; i < n; i += 100 {
		e.write(msgs[i : i+100]...)
	}
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), n))
	checkOrder(t, e.sink.Delivered())
	require.Empty(t, e.sink.Violations())
	require.Positive(t, r1.Stats().Delivered)
	require.Positive(t, r2.Stats().Delivered)
}

func TestRetryThenSuccessHoldsBackOnlyThatKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	failures := 0
	e.sink.SetFail(func(m sinks.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if string(m.Payload) == "a1" && failures < 3 {
			failures++
			return errors.New("broker busy")
		}
		return nil
	})
	e.write(msg("t", "a", "a1"), msg("t", "a", "a2"), msg("t", "b", "b1"), msg("t", "a", "a3"), msg("t", "b", "b2"))
	e.start(e.config(), e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 5))

	var order []string
	for _, m := range e.sink.Delivered() {
		order = append(order, string(m.Payload))
		if string(m.Payload) == "a1" {
			require.Equal(t, 4, m.Attempt)
		}
	}
	require.Equal(t, []string{"a1", "a2", "a3"}, filter(order, "a"))
	require.Equal(t, []string{"b1", "b2"}, filter(order, "b"))
	require.Less(t, index(order, "b2"), index(order, "a1"), "key b is not held back by key a's retries")
	require.Equal(t, 0, e.count("dead_letters"))
	require.Equal(t, 8, e.sink.Attempts(), "3 failures of a1 and 5 deliveries: a2 and a3 never tried while a1 waited")
}

func filter(xs []string, prefix string) []string {
	var out []string
	for _, x := range xs {
		if x[:1] == prefix {
			out = append(out, x)
		}
	}
	return out
}

func index(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

func TestDeadLetterAfterMaxAttemptsThenKeyMovesOn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "bad" {
			return errors.New("boom")
		}
		return nil
	})
	e.write(msg("t", "k", "bad"), msg("t", "k", "after"))
	e.start(e.config(), e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 1))
	require.Equal(t, "after", string(e.sink.Delivered()[0].Payload))
	eventually(t, 5*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not empty")

	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	d := dls[0]
	require.Equal(t, "bad", string(d.Payload))
	require.Equal(t, 5, d.Attempts)
	require.Equal(t, relay.ReasonMaxAttempts, d.Reason)
	require.Equal(t, "boom", *d.FirstError)
	require.Equal(t, "boom", *d.LastError)
	require.NotNil(t, d.FirstFailedAt)
}

func TestPermanentErrorSkipsRetries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "poison" {
			return sinks.Permanent(errors.New("message too large"))
		}
		return nil
	})
	e.write(msg("t", "k", "poison"), msg("t", "k", "next"), msg("t", "other", "x"))
	e.start(e.config(), e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 2))
	eventually(t, 5*time.Second, func() bool { return e.count("dead_letters") == 1 }, "no dead letter")
	admin, _ := operator.New(e.pool, e.schema)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Equal(t, 1, dls[0].Attempts)
	require.Contains(t, *dls[0].LastError, "message too large")
}

func TestReplayKeepsMessageIDAndConcurrentReplaysDoNotDuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var failing sync.Map
	failing.Store("on", true)
	e.sink.SetFail(func(m sinks.Message) error {
		if _, ok := failing.Load("on"); ok {
			return sinks.Permanent(errors.New("rejected"))
		}
		return nil
	})
	const n = 200
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, msg("replay", fmt.Sprintf("k%d", i%7), fmt.Sprint(i)))
	}
	e.write(msgs...)
	_, stop := e.start(e.config(), e.sink)
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == n }, "not all dead-lettered")
	stop()

	admin, _ := operator.New(e.pool, e.schema)
	before, err := admin.List(context.Background(), operator.Selection{All: true, Limit: n})
	require.NoError(t, err)
	ids := map[int64]string{}
	for _, d := range before {
		ids[d.ID] = d.MessageID
	}

	dry, err := admin.Replay(context.Background(), operator.Selection{Topic: "replay"}, operator.ReplayOptions{DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry.IDs(operator.Replayed), n)
	require.Equal(t, n, e.count("dead_letters"), "dry run changes nothing")
	_, err = admin.Replay(context.Background(), operator.Selection{}, operator.ReplayOptions{})
	require.ErrorIs(t, err, operator.ErrEmptySelection)

	// Five operators replay everything at once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var replayed []int64
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := admin.Replay(context.Background(), operator.Selection{All: true}, operator.ReplayOptions{})
			require.NoError(t, err)
			mu.Lock()
			replayed = append(replayed, got.IDs(operator.Replayed)...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(replayed, func(i, j int) bool { return replayed[i] < replayed[j] })
	require.Len(t, replayed, n, "every dead letter replayed exactly once")
	for i := 1; i < len(replayed); i++ {
		require.NotEqual(t, replayed[i-1], replayed[i])
	}
	require.Equal(t, 0, e.count("dead_letters"))

	failing.Delete("on")
	sink2 := memory.New()
	e.start(e.config(), sink2)
	require.NoError(t, sink2.WaitFor(waitCtx(t, 20*time.Second), n))
	for _, m := range sink2.Delivered() {
		require.Equal(t, ids[m.Seq], m.ID, "replay keeps the message id")
		require.Equal(t, 1, m.Attempt, "replay starts a fresh attempt count")
	}
	checkOrder(t, sink2.Delivered())
}

func TestPurge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error { return sinks.Permanent(errors.New("no")) })
	e.write(msg("a", "", "1"), msg("b", "", "2"))
	e.start(e.config(), e.sink)
	eventually(t, 20*time.Second, func() bool { return e.count("dead_letters") == 2 }, "not dead-lettered")
	admin, _ := operator.New(e.pool, e.schema)
	n, err := admin.Purge(context.Background(), operator.Selection{Topic: "a"}, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = admin.Purge(context.Background(), operator.Selection{DeadBefore: time.Now().Add(-time.Hour)}, false)
	require.NoError(t, err)
	require.EqualValues(t, 0, n, "nothing older than an hour")
	n, err = admin.Purge(context.Background(), operator.Selection{OlderThan: time.Hour}, false)
	require.NoError(t, err)
	require.EqualValues(t, 0, n, "nothing older than an hour, by the database's clock")
	n, err = admin.Purge(context.Background(), operator.Selection{Topic: "a"}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, e.count("dead_letters"))
}

func TestNotifyWakesIdleRelay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	cfg.PollInterval = time.Hour // only a notification can wake it
	r, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 256 }, "lanes not acquired")
	// Let the workers go idle, waiting on the hour-long poll.
	awaitNext(t, r, relay.SigWatcherIdle)
	start := time.Now()
	e.write(msg("t", "k", "wake"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 1))
	t.Logf("commit to delivery: %s", time.Since(start))
}

func TestOutOfOrderCommitsAreNotSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start(e.config(), e.sink)
	ctx := context.Background()
	// tx1 takes the lower id but commits last.
	tx1, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.w.Write(ctx, tx1, msg("t", "x", "first-id")))
	for i := 0; i < 20; i++ {
		e.write(msg("t", fmt.Sprintf("y%d", i), "later-id"))
	}
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 20))
	require.NoError(t, tx1.Commit(ctx))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 21))
	eventually(t, 5*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not empty")
}

func TestCrashMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A slow sink keeps the batch transaction open while we kill the
	// relay's connections from the server side.
	e.sink.SetDelay(300 * time.Millisecond)
	const n = 300
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%10), fmt.Sprint(i)))
	}
	e.write(msgs...)
	cfg := e.config()
	cfg.ID = "crash-" + e.schema
	// The relay's sessions are told apart by their application_name
	// (the claim's text is longer than pg_stat_activity keeps).
	app := "crash-" + e.schema[len(e.schema)-8:]
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	r, _ := e.startOn(u.String(), cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.Stats().Claimed > 0 }, "nothing claimed")
	var killed int
	require.NoError(t, e.pool.QueryRow(context.Background(), `
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'idle in transaction' AND pid <> pg_backend_pid()`, app).Scan(&killed))
	t.Logf("terminated %d relay backends mid-batch", killed)
	require.Positive(t, killed)
	e.sink.SetDelay(0)
	eventually(t, 30*time.Second, func() bool { return e.count("messages") == 0 }, "outbox not drained after crash")

	seen := map[int64]int{}
	for _, m := range e.sink.Delivered() {
		seen[m.Seq]++
	}
	require.Len(t, seen, n, "every message delivered")
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	t.Logf("%d re-deliveries after the crash", dups)
	require.Positive(t, r.Stats().CommitFailures)
	checkOrder(t, e.sink.Delivered())
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetDelay(500 * time.Millisecond)
	var msgs []outbox.Message
	for i := 0; i < 40; i++ {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i), fmt.Sprint(i)))
	}
	e.write(msgs...)
	cfg := e.config()
	cfg.BatchSize = 10
	r, stop := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.Stats().Claimed > 0 }, "nothing claimed")
	stop() // waits for Run to return
	st := r.Stats()
	require.Equal(t, st.Claimed, st.Delivered, "in-flight batches finished, none abandoned")
	require.EqualValues(t, 0, st.CommitFailures)
	require.Equal(t, 40-int(st.Delivered), e.count("messages"))
	require.Equal(t, int(st.Delivered), e.sink.Len())
	var owned int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table("lanes")+" WHERE owner IS NOT NULL").Scan(&owned))
	require.Zero(t, owned, "lanes handed back on shutdown")
	require.Zero(t, e.count("relays"))
}

func TestStatus(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.write(msg("a", "k", "1"), msg("a", "k", "2"), msg("b", "", "3"))
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Pending)
	require.Len(t, st.Topics, 2)
	require.Equal(t, "a", st.Topics[0].Topic)
	require.EqualValues(t, 2, st.Topics[0].Pending)
	require.Equal(t, 256, st.FreeLanes)
}

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]relay.Config{
		"workers":        {Workers: -1},
		"batch-size":     {BatchSize: 100000},
		"heartbeat":      {LeaseTTL: 3 * time.Second, Heartbeat: 10 * time.Second},
		"schema":         {Schema: string(make([]byte, 80))},
		"on-dead-letter": {OnDeadLetter: "park"},
	} {
		err := cfg.WithDefaults().Validate()
		require.ErrorContains(t, err, field)
	}
	require.NoError(t, relay.Config{}.WithDefaults().Validate())
}

func TestDelayedMessageHoldsBackItsKeyOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.w.Write(ctx, tx,
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("a1-delayed"), DeliverAfter: time.Hour},
		msg("t", "a", "a2"),
		msg("t", "b", "b1"),
	))
	require.NoError(t, tx.Commit(ctx))
	cfg := e.config()
	r, _ := e.start(cfg, e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 1))
	require.Equal(t, "b1", string(e.sink.Delivered()[0].Payload), "other keys are not held back")
	// Several claims later, key a still waits for its time.
	for range 5 {
		r.Wake()
		claimedAgain(t, r, int64(cfg.Workers))
	}
	require.Equal(t, 1, e.sink.Len(), "not delivered before its time")
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table("messages")+" SET available_at = now() WHERE available_at IS NOT NULL")
	require.NoError(t, err)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 3))
	got := e.sink.Delivered()
	require.Equal(t, "a1-delayed", string(got[1].Payload))
	require.Equal(t, "a2", string(got[2].Payload), "a later message of the delayed key waits for it")
}

func TestReplayRestoresDedupKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error { return sinks.Permanent(errors.New("no")) })
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.w.Write(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("x"), DedupKey: "d1"}))
	require.NoError(t, tx.Commit(ctx))
	_, stop := e.start(e.config(), e.sink)
	eventually(t, 10*time.Second, func() bool { return e.count("dead_letters") == 1 }, "not dead-lettered")
	stop()
	// While dead, the key is free: a new write goes through.
	admin, _ := operator.New(e.pool, e.schema)
	replayed, err := admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, replayed.Count(operator.Replayed))
	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := e.w.Insert(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("y"), DedupKey: "d1"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.True(t, res[0].Duplicate, "the replayed message is pending again under its dedup key")
}

func TestArchiveAndReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// A stale partition from long ago, which retention must drop.
	old := time.Now().UTC().AddDate(0, 0, -30).Truncate(24 * time.Hour)
	_, err := e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		e.table("archive_p"+old.Format("20060102")), e.table("archive"),
		old.Format(time.RFC3339), old.AddDate(0, 0, 1).Format(time.RFC3339)))
	require.NoError(t, err)

	e.write(msg("orders", "k", "1"), msg("orders", "k", "2"), msg("billing", "k", "3"))
	cfg := e.config()
	cfg.Archive = true
	r, stop := e.start(cfg, e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 3))
	eventually(t, 5*time.Second, func() bool { return e.count("archive") == 3 }, "not archived")
	stop()
	require.EqualValues(t, 3, r.Stats().Delivered)
	require.Equal(t, 0, e.count("messages"))
	var parts []string
	rows, err := e.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY 1`, e.schema)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		parts = append(parts, p)
	}
	require.Len(t, parts, 3, "today and two days ahead; the 30-day-old partition is gone: %v", parts)

	admin, _ := operator.New(e.pool, e.schema)
	n, err := admin.ReplayArchive(ctx, operator.ArchiveSelection{FromAgo: time.Hour, Topic: "orders"}, true)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	n, err = admin.ReplayArchive(ctx, operator.ArchiveSelection{FromAgo: time.Hour, ToAgo: time.Minute, Topic: "orders"}, true)
	require.NoError(t, err)
	require.EqualValues(t, 0, n, "nothing was created more than a minute ago")
	n, err = admin.ReplayArchive(ctx, operator.ArchiveSelection{From: time.Now().Add(-time.Hour), Topic: "orders"}, true)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	n, err = admin.ReplayArchive(ctx, operator.ArchiveSelection{From: time.Now().Add(-time.Hour), Topic: "orders"}, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	sink2 := memory.New()
	e.start(e.config(), sink2)
	require.NoError(t, sink2.WaitFor(waitCtx(t, 10*time.Second), 2))
	first := e.sink.Delivered()
	again := sink2.Delivered()
	require.Equal(t, "1", string(again[0].Payload))
	require.Equal(t, "2", string(again[1].Payload))
	require.Equal(t, first[0].ID, again[0].ID, "a replay keeps the message id")
}

func TestRoutesAreIndependent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	orders, billing := memory.New(), memory.New()
	var tried sync.Map
	billing.SetFail(func(m sinks.Message) error {
		tried.Store(string(m.Payload), true)
		return errors.New("billing webhook down")
	})

	a := e.config()
	a.Route, a.Topics = "orders", []string{"orders.*"}
	b := e.config()
	b.Route, b.Topics, b.ExcludeTopics = "billing", []string{"billing.*", "orders.refund*"}, a.Topics
	b.MaxAttempts = 1000
	ra, _ := e.start(a, orders)
	rb, _ := e.start(b, billing)
	eventually(t, 10*time.Second, func() bool { return ra.OwnedLanes() == 256 && rb.OwnedLanes() == 256 },
		"each route leases all 256 lanes: %d, %d", ra.OwnedLanes(), rb.OwnedLanes())

	// The same key on both routes: billing's failures must not hold back
	// orders.
	e.write(msg("billing.invoice", "cust-1", "b1"), msg("orders.placed", "cust-1", "o1"),
		msg("billing.invoice", "cust-1", "b2"), msg("orders.refunded", "cust-1", "o2"), msg("other", "x", "unrouted"))
	require.NoError(t, orders.WaitFor(waitCtx(t, 10*time.Second), 2))
	got := orders.Delivered()
	require.Equal(t, "o1", string(got[0].Payload))
	require.Equal(t, "o2", string(got[1].Payload), "first matching route wins: orders.* before orders.refund*")
	eventually(t, 5*time.Second, func() bool { return billing.Attempts() >= 2 }, "billing retried")
	require.Zero(t, billing.Len())
	require.Zero(t, e.count("dead_letters"))
	var pending int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+e.table("messages")+" WHERE topic LIKE 'billing.%'").Scan(&pending))
	require.Equal(t, 2, pending, "billing messages wait for their sink")
	_, b2Tried := tried.Load("b2")
	require.False(t, b2Tried, "b2 waits behind b1 within its own route")
}

func TestRoutePatternsAreLiteralExceptGlobs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sink := memory.New()
	cfg := e.config()
	cfg.Route, cfg.Topics = "literal", []string{"a_c", "100%"}
	r, _ := e.start(cfg, sink)
	e.write(msg("abc", "", "no"), msg("1000", "", "no"), msg("a_c", "", "yes"), msg("100%", "", "yes"))
	require.NoError(t, sink.WaitFor(waitCtx(t, 10*time.Second), 2))
	claimedAgain(t, r, 2*int64(cfg.Workers)) // give a wrong match the chance to show
	for _, m := range sink.Delivered() {
		require.Equal(t, "yes", string(m.Payload), "topic %q", m.Topic)
	}
	// The delivered rows leave once their transaction commits (a later
	// claim's may carry their delete: up to 50 ms).
	eventually(t, signalBound, func() bool { return e.count("messages") == 2 }, "the two others left: %d", e.count("messages"))
}

// The deprecated names read patterns as package topic does (its tests
// hold the language's table).
func TestTopicWrappers(t *testing.T) {
	t.Parallel()
}

func TestStatusShowsRelaysAndInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetDelay(2 * time.Second)
	e.write(msg("t", "k", "1"), msg("t", "j", "2"))
	cfg := e.config()
	cfg.ID = "status-relay"
	e.start(cfg, e.sink)
	admin, _ := operator.New(e.pool, e.schema)
	eventually(t, 10*time.Second, func() bool {
		st, err := admin.Status(context.Background())
		require.NoError(t, err)
		return len(st.Relays) == 1 && st.Relays[0].InFlight == 2 && st.Relays[0].Lanes == 256
	}, "status never showed the relay with 2 messages in flight")
}

// notAttempting is a sink that gives up on every batch without trying.
type notAttempting struct{ calls atomic.Int64 }

func (s *notAttempting) Send(_ context.Context, msgs []sinks.Message) error {
	s.calls.Add(1)
	be := sinks.NewBatchError(len(msgs))
	for i := range be.Errs {
		be.Errs[i] = sinks.ErrNotAttempted
	}
	return be
}
func (s *notAttempting) Close(context.Context) error { return nil }

// A sink that gives up on every batch without trying, and says nothing
// about the destination, makes its worker back off: no spin, no attempt,
// no breaker.
func TestSinkThatAttemptsNothingDoesNotSpin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.write(msg("t", "k", "1"))
	sink := &notAttempting{}
	hooks := &cycleErrs{}
	cfg := e.config()
	cfg.Hooks = hooks
	r, _ := e.start(cfg, sink)
	eventually(t, signalBound, func() bool { return hooks.n.Load() >= 3 }, "back-offs after batches the sink did not attempt")
	// Each call is followed by a back-off, not by another claim at once
	// (a worker's batch may be with the sink, its back-off not yet
	// reported).
	calls := sink.calls.Load()
	require.LessOrEqual(t, calls, hooks.n.Load()+int64(cfg.Workers), "the worker backs off instead of re-claiming at once")
	require.Equal(t, 1, e.count("messages"), "nothing lost, nothing counted")
	require.Zero(t, r.SignalCount(relay.SigOutage), "no evidence of an outage")
}

type cycleErrs struct {
	relay.NopHooks
	n atomic.Int64
}

func (c *cycleErrs) CycleError(error) { c.n.Add(1) }

func TestCycleErrorsAreReportedAndRecovered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.config()
	hooks := &cycleErrs{}
	cfg.Hooks = relay.MultiHooks(hooks)
	r, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 256 }, "lanes")
	ctx := context.Background()
	// Break the claim: the table it reads is gone for a moment.
	_, err := e.pool.Exec(ctx, "ALTER TABLE "+e.table("messages")+" RENAME TO messages_away")
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool { return hooks.n.Load() > 0 }, "no cycle error reported")
	_, err = e.pool.Exec(ctx, "ALTER TABLE "+e.table("messages_away")+" RENAME TO messages")
	require.NoError(t, err)
	e.write(msg("t", "k", "after"))
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 15*time.Second), 1))
}

func TestPriorityOvertakesOtherKeysNeverItsOwn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var backlog []outbox.Message
	for i := 0; i < 2000; i++ {
		backlog = append(backlog, msg("t", fmt.Sprintf("k%d", i%50), fmt.Sprintf("b%d", i)))
	}
	e.write(backlog...)
	e.write(msg("t", "hot", "hot1"), msg("t", "hot", "hot2"))
	e.write(backlog[:500]...)
	// Last in, with priority: the hot key's message and a keyless one.
	e.write(
		outbox.Message{Topic: "t", Key: "hot", Payload: []byte("hot-urgent"), Priority: 5},
		outbox.Message{Topic: "t", Payload: []byte("keyless-urgent"), Priority: 1},
		msg("t", "hot", "hot-after"),
	)
	cfg := e.config()
	cfg.Workers = 1
	e.start(cfg, e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), 2503))
	got := e.sink.Delivered()
	checkOrder(t, got)
	var order []string
	for _, m := range got {
		order = append(order, string(m.Payload))
	}
	// The first batch holds the priority messages and the messages of
	// their key: the earlier ones first, in order, and the later one too.
	first := order[:5]
	require.ElementsMatch(t, []string{"hot1", "hot2", "hot-urgent", "hot-after", "keyless-urgent"}, first, "delivered first: %v", first)
	require.Less(t, index(order, "hot1"), index(order, "hot2"))
	require.Less(t, index(order, "hot2"), index(order, "hot-urgent"))
	require.Less(t, index(order, "hot-urgent"), index(order, "hot-after"))
}

func TestPriorityWaitsForItsKeysRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var failed atomic.Int32
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "a1" && failed.Add(1) <= 2 {
			return errors.New("transient")
		}
		return nil
	})
	e.write(msg("t", "a", "a1"), msg("t", "b", "b1"))
	e.write(outbox.Message{Topic: "t", Key: "a", Payload: []byte("a2-urgent"), Priority: 9})
	e.start(e.config(), e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 10*time.Second), 3))
	var order []string
	for _, m := range e.sink.Delivered() {
		order = append(order, string(m.Payload))
	}
	require.Less(t, index(order, "a1"), index(order, "a2-urgent"), "priority never overtakes a failing earlier message of its key: %v", order)
	require.EqualValues(t, 3, failed.Load())
}

// Two relays (two routes) woken by one shared Listen: with a poll interval
// far longer than the test, only the notification can deliver in time.
func TestSharedListenerWakesEveryRelay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := memory.New(), memory.New()
	cfgA, cfgB := e.config(), e.config()
	cfgA.Route, cfgA.Topics, cfgA.PollInterval = "a", []string{"a.*"}, time.Hour
	cfgB.Route, cfgB.Topics, cfgB.PollInterval = "b", []string{"b.*"}, time.Hour
	cfgA, cfgB = relay.WithSharedListener(cfgA), relay.WithSharedListener(cfgB)
	ra, _ := e.start(cfgA, a)
	rb, _ := e.start(cfgB, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		relay.ListenConfig(ctx, e.pool, ra.ListenerConfig(relay.Config{Schema: e.schema, Logger: testLogger(t)}), func() { ra.Wake(); rb.Wake() }, func() { ra.MembersChanged(); rb.MembersChanged() })
	}()
	t.Cleanup(func() { cancel(); <-done })
	// Let both relays take their lanes and go idle, then write.
	eventually(t, 10*time.Second, func() bool { return ra.OwnedLanes() == 256 && rb.OwnedLanes() == 256 }, "lanes")
	awaitNext(t, ra, relay.SigWatcherIdle) // the shared listener's watcher
	e.write(msg("a.x", "k", "to a"), msg("b.x", "k", "to b"))
	require.NoError(t, a.WaitFor(waitCtx(t, 5*time.Second), 1))
	require.NoError(t, b.WaitFor(waitCtx(t, 5*time.Second), 1))
}
