package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// outboxOf is one outbox of a sources test: where it is and how to write
// to it.
type outboxOf struct {
	name   string
	url    string
	pool   *pgxpool.Pool // the test's own, for writing
	schema string
}

// writeKeys commits n messages to ob, spread over keys k0..k4, each
// payload "<source>:<key>:<seq>".
func (ob outboxOf) writeKeys(t *testing.T, n int) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: ob.schema})
	require.NoError(t, err)
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprintf("k%d", i%5)
		tx, err := ob.pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "t", Key: key, Payload: fmt.Appendf(nil, "%s:%s:%06d", ob.name, key, i)}))
		require.NoError(t, tx.Commit(ctx))
	}
}

// relayPool opens the relay's own pool to ob's database.
func (ob outboxOf) relayPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: ob.url, Workers: 1})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// delivered returns, per source, the payloads sink received of it, in
// order.
func delivered(sink *memory.Sink) map[string][]string {
	out := map[string][]string{}
	for _, m := range sink.Delivered() {
		src, _, _ := strings.Cut(string(m.Payload), ":")
		out[src] = append(out[src], string(m.Payload))
	}
	return out
}

// payloadsInKeyOrder reports the first payload of got that comes before an
// earlier one of its key.
func payloadsInKeyOrder(got []string) error {
	last := map[string]string{}
	for _, p := range got {
		parts := strings.Split(p, ":")
		key := parts[0] + ":" + parts[1]
		if prev, ok := last[key]; ok && prev >= p {
			return fmt.Errorf("%s after %s", p, prev)
		}
		last[key] = p
	}
	return nil
}

func stateOf(s *relay.Sources, name string) relay.SourceState {
	for _, st := range s.States() {
		if st.Name == name {
			return st
		}
	}
	return relay.SourceState{}
}

// Two outboxes on the shared server and one on a server that is down:
// the first two deliver, in order per key, while the third is reported
// down; once its server is back, its messages, committed before it
// stopped, are delivered too, and no source's relays ever stopped the
// others.
func TestSourcesIsolateADatabaseThatIsDown(t *testing.T) {
	srv := pgtest.Server(t)
	var obs []outboxOf
	for _, name := range []string{"a", "b"} {
		pool, schema := pgtest.Schema(t)
		obs = append(obs, outboxOf{name: name, url: pgtest.URL(), pool: pool, schema: schema})
	}
	cPool, cSchema := srv.Schema(t)
	c := outboxOf{name: "c", url: srv.URL(), pool: cPool, schema: cSchema}
	c.writeKeys(t, 40)
	ctx := context.Background()
	require.NoError(t, srv.Stop(ctx))

	sink := memory.New()
	var list []relay.Source
	for _, ob := range append(obs, c) {
		cfg := relay.Config{Schema: ob.schema, Workers: 1, BatchSize: 20, PollInterval: 50 * time.Millisecond,
			LeaseTTL: 3 * time.Second, Heartbeat: 200 * time.Millisecond, ConnectTimeout: 300 * time.Millisecond, Logger: testLogger(t)}
		list = append(list, relay.Source{Name: ob.name, Pool: ob.relayPool(t), Set: relay.SetConfig{Config: cfg}, Sink: sink})
	}
	srcs, err := relay.NewSources(relay.SourcesConfig{Sources: list, RestartMax: 200 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	finished := make(chan struct{})
	var runErr error
	go func() { defer close(finished); runErr = srcs.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-finished })

	for _, ob := range obs {
		ob.writeKeys(t, 100)
	}
	eventually(t, 30*time.Second, func() bool {
		d := delivered(sink)
		return len(d["a"]) >= 100 && len(d["b"]) >= 100 && stateOf(srcs, "c").State == relay.SourceDown
	}, "a and b delivered while c is down")
	require.Empty(t, delivered(sink)["c"])
	down := stateOf(srcs, "c")
	require.Error(t, down.Err)
	// It stays down, since its first failure, while it keeps failing.
	eventually(t, 30*time.Second, func() bool { return stateOf(srcs, "c").Restarts >= down.Restarts+2 }, "c restarted twice more")
	again := stateOf(srcs, "c")
	require.Equal(t, relay.SourceDown, again.State)
	require.Equal(t, down.Since, again.Since)
	require.Equal(t, relay.SourceRunning, stateOf(srcs, "a").State)
	degraded, err := srcs.Readiness(ctx)
	require.NoError(t, err, "ready while some source delivers")
	require.Contains(t, degraded, "source c: down since")
	require.NotContains(t, degraded, "source a")

	require.NoError(t, srv.Start(ctx))
	eventually(t, 30*time.Second, func() bool { return len(delivered(sink)["c"]) >= 40 }, "c delivered once its server is back")
	eventually(t, 10*time.Second, func() bool { return stateOf(srcs, "c").State == relay.SourceRunning }, "c running")
	require.Positive(t, stateOf(srcs, "c").Restarts)
	degraded, err = srcs.Readiness(ctx)
	require.NoError(t, err)
	require.Empty(t, degraded)

	// Its server stopping under running relays makes it down too, once
	// its lease lapses, and running again once the server is back.
	require.NoError(t, srv.Stop(ctx))
	eventually(t, 30*time.Second, func() bool { return stateOf(srcs, "c").State == relay.SourceDown }, "c down while its relays run")
	require.ErrorContains(t, stateOf(srcs, "c").Err, "lane lease has not been renewed")
	degraded, err = srcs.Readiness(ctx)
	require.NoError(t, err)
	require.Contains(t, degraded, "source c: down since")
	require.NoError(t, srv.Start(ctx))
	eventually(t, 30*time.Second, func() bool { return stateOf(srcs, "c").State == relay.SourceRunning }, "c running again")

	d := delivered(sink)
	for _, name := range []string{"a", "b", "c"} {
		require.NoError(t, payloadsInKeyOrder(d[name]), "source %s", name)
	}
	require.Len(t, d["a"], 100)
	require.Len(t, d["b"], 100)
	require.Len(t, d["c"], 40)
	stop()
	<-finished
	require.NoError(t, runErr)
	for _, st := range srcs.States() {
		require.Equal(t, relay.SourceStopped, st.State, st.Name)
	}
}

// Sources added to a running process start at once and deliver; a source
// removed stops (its relays drain) and its later messages wait in its
// outbox; a name cannot be added twice.
func TestSourcesAddAndRemoveWhileRunning(t *testing.T) {
	var obs []outboxOf
	for _, name := range []string{"a", "b"} {
		pool, schema := pgtest.Schema(t)
		obs = append(obs, outboxOf{name: name, url: pgtest.URL(), pool: pool, schema: schema})
	}
	sink := memory.New()
	source := func(ob outboxOf) relay.Source {
		cfg := relay.Config{Schema: ob.schema, Workers: 1, BatchSize: 20, PollInterval: 50 * time.Millisecond,
			LeaseTTL: 3 * time.Second, Heartbeat: 200 * time.Millisecond, Logger: testLogger(t)}
		return relay.Source{Name: ob.name, Pool: ob.relayPool(t), Set: relay.SetConfig{Config: cfg}, Sink: sink}
	}
	// Both pools before the stop below: cleanups run last first, and a
	// pool closes only once its source stopped.
	a, b := source(obs[0]), source(obs[1])
	srcs, err := relay.NewSources(relay.SourcesConfig{Sources: []relay.Source{a}, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { defer close(finished); _ = srcs.Run(ctx) }()
	t.Cleanup(func() { stop(); <-finished })

	obs[0].writeKeys(t, 20)
	obs[1].writeKeys(t, 30)
	eventually(t, 20*time.Second, func() bool { return len(delivered(sink)["a"]) == 20 }, "a delivered")
	require.Empty(t, delivered(sink)["b"], "b is not a source yet")

	require.NoError(t, srcs.Add(b))
	require.ErrorContains(t, srcs.Add(b), `source.name: "b" used twice`)
	eventually(t, 20*time.Second, func() bool { return len(delivered(sink)["b"]) == 30 }, "b delivered once added")

	require.NoError(t, srcs.Remove("a"))
	require.ErrorContains(t, srcs.Remove("a"), `no source named "a"`)
	require.Len(t, srcs.States(), 1)
	obs[0].writeKeys(t, 5)
	obs[1].writeKeys(t, 5)
	eventually(t, 20*time.Second, func() bool { return len(delivered(sink)["b"]) == 35 }, "b goes on")
	var left int
	require.NoError(t, obs[0].pool.QueryRow(context.Background(), "SELECT count(*) FROM "+migrations.Ident(obs[0].schema)+".messages").Scan(&left))
	require.Equal(t, 5, left, "a's later messages wait in its outbox")
	require.Len(t, delivered(sink)["a"], 20)
}

func TestNewSourcesChecksNames(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/unused") // connects lazily: never here
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sink := memory.New()
	for _, c := range []struct {
		srcs []relay.Source
		want string
	}{
		{nil, "sources: at least one source"},
		{[]relay.Source{{Name: "A", Pool: pool, Sink: sink}}, `sources[0].name: "A" must be`},
		{[]relay.Source{{Name: "a", Pool: pool, Sink: sink}, {Name: "a", Pool: pool, Sink: sink}}, `sources[1].name: "a" used twice`},
		{[]relay.Source{{Name: "a", Sink: sink}}, "sources[0].pool: required"},
		{[]relay.Source{{Name: "a", Pool: pool}}, "sources[0]: outbox: sink: required"},
	} {
		_, err := relay.NewSources(relay.SourcesConfig{Sources: c.srcs})
		require.ErrorContains(t, err, c.want)
	}
}

// heldSink holds each Send until the test lets one of its source's go
// (let), and counts each source's sends under way, the most at once, and
// those that ended.
type heldSink struct {
	mu                   sync.Mutex
	sending, most, ended map[string]int
	let                  map[string]chan struct{}
	out                  *memory.Sink
}

func newHeldSink(names ...string) *heldSink {
	s := &heldSink{sending: map[string]int{}, most: map[string]int{}, ended: map[string]int{}, let: map[string]chan struct{}{}, out: memory.New()}
	for _, n := range names {
		s.let[n] = make(chan struct{})
	}
	return s
}

func (s *heldSink) Send(ctx context.Context, msgs []sinks.Message) error {
	src, _, _ := strings.Cut(string(msgs[0].Payload), ":")
	s.mu.Lock()
	s.sending[src]++
	s.most[src] = max(s.most[src], s.sending[src])
	let := s.let[src]
	s.mu.Unlock()
	var err error
	select {
	case <-let:
		err = s.out.Send(ctx, msgs)
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	s.sending[src]--
	s.ended[src]++
	s.mu.Unlock()
	return err
}

func (s *heldSink) Close(ctx context.Context) error { return s.out.Close(ctx) }

// counts returns src's sends under way, the most at once since the last
// call, and those that ended.
func (s *heldSink) counts(src string) (under, most, ended int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	under, most, ended = s.sending[src], s.most[src], s.ended[src]
	s.most[src] = under
	return under, most, ended
}

func (s *heldSink) under(src string) int {
	under, _, _ := s.counts(src)
	return under
}

// TestSourcesShareTheBatches: a source alone is not held back by
// SourcesConfig.Batches; once another source has work, each has its part
// of them, and the one with a backlog waits for its own batches to end
// before it claims again.
func TestSourcesShareTheBatches(t *testing.T) {
	var obs []outboxOf
	for _, name := range []string{"a", "b"} {
		pool, schema := pgtest.Schema(t)
		obs = append(obs, outboxOf{name: name, url: pgtest.URL(), pool: pool, schema: schema})
	}
	sink := newHeldSink("a", "b")
	var list []relay.Source
	for _, ob := range obs {
		cfg := relay.Config{Schema: ob.schema, Workers: 2, Pipeline: 1, BatchSize: 5, PollInterval: 50 * time.Millisecond,
			PublishTimeout: time.Minute, LeaseTTL: 3 * time.Second, Heartbeat: 200 * time.Millisecond, Logger: testLogger(t)}
		list = append(list, relay.Source{Name: ob.name, Pool: ob.relayPool(t), Set: relay.SetConfig{Config: cfg}, Sink: sink})
	}
	srcs, err := relay.NewSources(relay.SourcesConfig{Sources: list, Batches: 1, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { defer close(finished); _ = srcs.Run(ctx) }()
	t.Cleanup(func() { stop(); <-finished })

	// a alone: both its workers send at once, beyond Batches (20 keys: both
	// workers' lanes have some).
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: obs[0].schema})
	require.NoError(t, err)
	for i := range 100 {
		key := fmt.Sprintf("k%d", i%20)
		require.NoError(t, pgx.BeginFunc(ctx, obs[0].pool, func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: "t", Key: key, Payload: fmt.Appendf(nil, "a:%s:%06d", key, i)})
		}))
	}
	eventually(t, 20*time.Second, func() bool { return sink.under("a") == 2 }, "a's two workers send at once")

	// b has work: it sends at once, its part being at least one.
	obs[1].writeKeys(t, 10)
	eventually(t, 20*time.Second, func() bool { return sink.under("b") == 1 }, "b sends beside a")

	// While b's send is under way, a has one at a time: as each of a's
	// ends, its other worker's send, which waited, starts.
	sink.let["a"] <- struct{}{}
	eventually(t, 20*time.Second, func() bool { u, _, e := sink.counts("a"); return u == 1 && e == 1 }, "one of a's sends ended")
	for i := 2; i <= 10; i++ {
		sink.let["a"] <- struct{}{}
		eventually(t, 20*time.Second, func() bool { _, _, e := sink.counts("a"); return e == i }, "a's send %d ended", i)
		eventually(t, 20*time.Second, func() bool { return sink.under("a") == 1 }, "a's next send started")
		_, most, _ := sink.counts("a")
		require.Equal(t, 1, most, "a had more than its part under way beside b")
	}
	close(sink.let["b"])
	close(sink.let["a"])
	// a's workers waited for its part (and so may b's, its part being one).
	for _, st := range srcs.States() {
		if st.Name == "a" {
			require.Positive(t, st.ShareWait, "a's wait for its part (SourceState.ShareWait)")
		}
	}
	eventually(t, 30*time.Second, func() bool {
		d := delivered(sink.out)
		return len(d["a"]) == 100 && len(d["b"]) == 10
	}, "everything delivered")
	for src, got := range delivered(sink.out) {
		require.NoError(t, payloadsInKeyOrder(got), src)
	}
}
