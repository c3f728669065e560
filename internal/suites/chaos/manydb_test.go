package chaos

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// manyPlan is one run of TestChaosManyDatabases.
type manyPlan struct {
	name      string
	databases int // sources, a database each, all on one throwaway server
	relays    int // relay processes, each relaying from every source
	keys      int // per database
	messages  int // committed messages over every database, at least
	// writeFor is the planned span of the writes; it sets their rate. The
	// writes go on until messages have committed, minKills kills have
	// happened and the block (if any) is over.
	writeFor  time.Duration
	minKills  int
	killEvery [2]time.Duration // a relay is SIGKILLed every [min, max)
	killPair  int              // every killPair-th kill takes every relay at once (0: never)
	// blockAt and block: one database refuses connections from blockAt
	// after the start of the writes, for block (0: never).
	blockAt, block time.Duration
	drain          time.Duration // limit for the drain after the chaos
	idleFor        time.Duration // the idle CPU measurement's window
}

// manySchema is every source's schema: the relays' default.
const manySchema = "outbox"

func shortManyPlan() manyPlan {
	return manyPlan{
		name: "short", databases: 50, relays: 1, keys: 20, messages: 15_000,
		writeFor: 20 * time.Second, minKills: 2,
		killEvery: [2]time.Duration{5 * time.Second, 8 * time.Second},
		// The drain takes seconds alone; under make test's parallel
		// packages and -race, 50 sources' batches queue for the shared
		// HTTP sink's connections past the publish timeout and are sent
		// again, and a minute was once too short (CI, 2026-11-29).
		drain: 3 * time.Minute, idleFor: 10 * time.Second,
	}
}

// longManyPlan runs two relays and kills one every 8-15 s (both at once
// every fourth time): each kill of one of two relays slows delivery for a
// few seconds while the other takes over its lanes of every source, so
// kills every few seconds would leave the relays behind the writers for
// the whole run (docs/chaos.md).
func longManyPlan() manyPlan {
	return manyPlan{
		name: "long", databases: 50, relays: 2, keys: 40, messages: 100_000,
		writeFor: 240 * time.Second, minKills: 15,
		killEvery: [2]time.Duration{8 * time.Second, 15 * time.Second}, killPair: 4,
		blockAt: 60 * time.Second, block: time.Minute,
		drain: 3 * time.Minute, idleFor: 10 * time.Second,
	}
}

// TestChaosManyDatabases runs one relay process (two in the long form)
// that relays from 50 databases at once (a sources list in its --config),
// into one HTTP receiver, while a writer commits messages in every
// database and the relays are SIGKILLed and restarted. In the long form
// one database also refuses connections for a minute: the other sources
// must deliver all along, the blocked one catch up after. Then it checks
// the contract per source: every committed message delivered, no
// rolled-back one, per-key order, duplicates identified by their message
// id, each source's messages under a producer of its own. It logs what an
// idle source costs: its relay sessions and the relay's CPU.
// CHAOS_LONG=1 selects the long form; CHAOS_SEED fixes the random choices.
func TestChaosManyDatabases(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the many-databases chaos test in -short mode: it runs a PostgreSQL server and relay processes")
	}
	p := shortManyPlan()
	if os.Getenv("CHAOS_LONG") == "1" {
		p = longManyPlan()
	}
	runMany(t, p)
}

// runMany runs plan p: the set-up, the writes under the chaos, the drain,
// the idle measurement, the relays' stop and the checks.
func runMany(t *testing.T, p manyPlan) {
	seed := chaosSeed(t)
	t.Logf("many-databases chaos, %s form, seed %d (CHAOS_SEED=%d reproduces the random choices)", p.name, seed, seed)
	ctx, cancel := testContext(t)
	defer cancel()
	f := newFleet(ctx, t, p, seed)
	f.chaos(ctx, rand.New(rand.NewPCG(seed, 0x5005CE)))
	if ctx.Err() != nil {
		t.Fatalf("test deadline reached during the chaos")
	}
	drained := f.waitDrained(ctx)
	idle := f.measureIdle(ctx)
	stopTook := f.c.stopAll()
	f.report(ctx, drained, stopTook, idle)
}

// fleet is the many-databases run: a throwaway server, its databases (a
// source each, a writer each), the receiver and the relays.
type fleet struct {
	t      *testing.T
	p      manyPlan
	srv    *pgtest.Instance
	admin  *pgxpool.Pool // the server's postgres database
	dbs    []string      // the databases, which name their sources
	config string        // the relays' config file: the sources list
	wls    []*workload   // by database
	rc     *receiver
	c      *cluster
	start  time.Time // of the writes
	wrote  time.Duration
	chaosT time.Duration

	mu     sync.Mutex
	events []string
	block  *blockResult // the long form's blocked database
}

// newFleet starts the server, makes and migrates the databases, the
// writers' business tables and the receiver, and prepares the relays.
func newFleet(ctx context.Context, t *testing.T, p manyPlan, seed uint64) *fleet {
	t.Helper()
	// Every relay holds a pool per source: with --workers 1 --pipeline 1,
	// 4 connections (its worker's, the lane lease's, LISTEN's, and one for
	// health checks and metrics); a relay started again may connect
	// before the backends of the one killed are gone. Each writer holds
	// one connection, and the test a few.
	conns := p.databases*(4*(p.relays+1)+1) + 40
	srv := pgtest.ServerConf(t, fmt.Sprintf("max_connections = %d", conns))
	f := &fleet{t: t, p: p, srv: srv, admin: srv.Pool(t)}
	began := time.Now()
	f.createDatabases(ctx)
	created := time.Since(began)
	bin := relayBinary(t)
	began = time.Now()
	f.migrate(ctx, bin)
	migrated := time.Since(began)
	began = time.Now()
	rate := float64(p.messages) / 0.9 / p.writeFor.Seconds() / float64(p.databases)
	for i, db := range f.dbs {
		wl := newWorkload(t, f.dbURL(db), manySchema, p.keys, rate, seed+uint64(i))
		wl.source = db
		f.wls = append(f.wls, wl)
	}
	t.Logf("set-up: %d databases created in %s, migrated by outbox-relay migrate --config in %s, business tables in %s",
		p.databases, created.Round(time.Millisecond), migrated.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	f.rc = newReceiver(t)
	f.c = newCluster(t, bin, srv.URL(), manySchema, manyRelayArgs(f.rc.url))
	f.c.sources = f.config
	return f
}

// manyRelayArgs is how the relays run: small resources per source (one
// worker, one batch in flight), fast retries and plentiful attempts so
// that nothing is dead-lettered, a short drain, and otherwise the
// defaults (lease TTL, poll and watch intervals, which set what an idle
// source costs, and the publish timeout: a send's wait for one of the
// shared HTTP sink's connections counts in it).
func manyRelayArgs(sinkURL string) []string {
	return []string{
		"--sink", sinkURL,
		"--workers", "1",
		"--pipeline", "1",
		"--batch-size", "100",
		"--retry-initial", "50ms",
		"--retry-max", "500ms",
		"--max-attempts", "1000",
		"--drain-timeout", drainTimeout.String(),
		"--log-level", "info",
		"--admin-addr", "127.0.0.1:0",
	}
}

// dbURL is the URL of database db on the fleet's server.
func (f *fleet) dbURL(db string) string {
	u, err := url.Parse(f.srv.URL())
	if err != nil {
		f.t.Fatalf("server URL: %v", err)
	}
	u.Path = "/" + db
	return u.String()
}

// createDatabases makes the databases and the config file that lists
// them as sources.
func (f *fleet) createDatabases(ctx context.Context) {
	var b strings.Builder
	b.WriteString("sources:\n")
	for i := range f.p.databases {
		db := fmt.Sprintf("db%02d", i)
		if _, err := f.admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			f.t.Fatalf("create database %s: %v", db, err)
		}
		f.dbs = append(f.dbs, db)
		fmt.Fprintf(&b, "  - name: %s\n    database-url: %s\n", db, f.dbURL(db))
	}
	f.config = filepath.Join(f.t.TempDir(), "sources.yaml")
	if err := os.WriteFile(f.config, []byte(b.String()), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// migrate runs `outbox-relay migrate --config`, which migrates every
// source.
func (f *fleet) migrate(ctx context.Context, bin string) {
	cmd := exec.CommandContext(ctx, bin, "migrate", "--config", f.config)
	cmd.Env = testkit.CleanEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		f.t.Fatalf("outbox-relay migrate --config: %v\n%s", err, out.String())
	}
	if n := strings.Count(out.String(), "schema migrated"); n != f.p.databases {
		f.t.Fatalf("outbox-relay migrate --config migrated %d sources, want %d:\n%s", n, f.p.databases, out.String())
	}
}

// note adds a line to the run's events, stamped with the time since the
// start of the writes.
func (f *fleet) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fmt.Sprintf("%6.1fs ", time.Since(f.start).Seconds())+fmt.Sprintf(format, args...))
}

// committed is how many messages the writers committed, over every
// database.
func (f *fleet) committed() int64 {
	var n int64
	for _, wl := range f.wls {
		n += wl.committed.Load()
	}
	return n
}

// chaos starts the relays and runs the writers on every database while
// the relays are SIGKILLed (and, in the long form, one database is
// blocked), until the plan's messages, kills and block have happened.
func (f *fleet) chaos(ctx context.Context, rng *rand.Rand) {
	slots := make([]string, f.p.relays)
	for i := range slots {
		slots[i] = fmt.Sprintf("r%d", i+1)
		f.c.start(slots[i])
	}
	f.start = time.Now()
	var blocked atomic.Bool
	var bg sync.WaitGroup
	if f.p.block > 0 {
		bg.Go(func() {
			sleepCtx(ctx, f.p.blockAt)
			if ctx.Err() == nil {
				r := f.blockSource(ctx, len(f.dbs)/2)
				f.mu.Lock()
				f.block = &r
				f.mu.Unlock()
			}
			blocked.Store(true)
		})
	} else {
		blocked.Store(true)
	}
	stopKills := make(chan struct{})
	bg.Go(func() { f.kills(ctx, rng, slots, stopKills) })
	target := int64(f.p.messages)
	until := func() bool {
		kills, _, _ := f.c.counts()
		return kills >= f.p.minKills && blocked.Load() && f.committed() >= target
	}
	var writers sync.WaitGroup
	for _, wl := range f.wls {
		writers.Go(func() { wl.run(ctx, 1, until) })
	}
	writers.Wait()
	f.wrote = time.Since(f.start)
	close(stopKills)
	bg.Wait()
	f.chaosT = time.Since(f.start)
}

// kills SIGKILLs a random relay (every killPair-th time, every relay at
// once) every killEvery until stop is closed; the cluster starts each
// again.
func (f *fleet) kills(ctx context.Context, rng *rand.Rand, slots []string, stop <-chan struct{}) {
	atRandomIntervals(ctx, rng, f.p.killEvery, stop, func(n int) {
		if f.p.killPair > 0 && n%f.p.killPair == 0 {
			f.note("SIGKILL all %d relays", f.c.killAll())
			return
		}
		if id := f.c.kill(slots[rng.IntN(len(slots))]); id != "" {
			f.note("SIGKILL %s (%d messages committed, %d delivered)", id, f.committed(), f.rc.count())
		}
	})
}

// deliveredBySource counts the receiver's deliveries per source.
func (f *fleet) deliveredBySource() map[string]int {
	f.rc.mu.Lock()
	defer f.rc.mu.Unlock()
	out := make(map[string]int, len(f.dbs))
	for _, d := range f.rc.log {
		out[d.Source]++
	}
	return out
}

// waitDrained polls every database until its outbox is empty and
// returns how long that took; it fails the test at the plan's deadline,
// naming the sources left.
func (f *fleet) waitDrained(ctx context.Context) time.Duration {
	start := time.Now()
	left := map[string]int64{}
	for _, db := range f.dbs {
		left[db] = -1
	}
	poll, cancel := context.WithTimeout(ctx, f.p.drain)
	defer cancel()
	testkit.Poll(poll, 250*time.Millisecond, func() bool {
		for i, db := range f.dbs {
			if _, ok := left[db]; !ok {
				continue
			}
			pending, _, err := outboxCounts(ctx, f.wls[i].pool, manySchema)
			if err == nil && pending == 0 {
				delete(left, db)
			} else if err == nil {
				left[db] = pending
			}
		}
		return len(left) == 0
	})
	if len(left) > 0 {
		f.t.Fatalf("outbox not drained within %s: %d sources left (pending by source, -1 unknown: %v)", f.p.drain, len(left), left)
	}
	return time.Since(start)
}
