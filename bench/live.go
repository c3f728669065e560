package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The live group: what one relay costs at the rates services run, against
// what it costs per message draining a backlog, in the same run and the
// same relay process. CPU is read from /proc for the relay process and
// for its database backends (found in pg_stat_activity by the relay's
// application_name; Postgres must run on this host).

// liveDrainN is the backlog of the live group's yardstick drain.
const liveDrainN = 100_000

// liveStats is one row of the live group.
type liveStats struct {
	Set        string  `json:"set,omitempty"` // the liveSet's label; empty on the shared server
	Sink       string  `json:"sink"`
	Load       string  `json:"load"`
	Offered    float64 `json:"offered_per_s,omitempty"`
	Achieved   float64 `json:"achieved_per_s,omitempty"` // messages delivered per second in the window
	WindowS    float64 `json:"window_s"`
	Messages   int64   `json:"messages_in_window"`
	RelayCPUUs float64 `json:"relay_cpu_us_per_msg,omitempty"`
	DBCPUUs    float64 `json:"db_cpu_us_per_msg,omitempty"`
	RelayX     float64 `json:"relay_x_drain,omitempty"`
	DBX        float64 `json:"db_x_drain,omitempty"`
	RelayCores float64 `json:"relay_cores"`
	DBCores    float64 `json:"db_cores"`
	TxPerMsg   float64 `json:"relay_tx_per_msg,omitempty"`
	TxPerS     float64 `json:"relay_tx_per_s"`
	StmtPerMsg float64 `json:"statements_per_msg,omitempty"` // all sessions of the database, writers' included
	// OwnStmtPerMsg is the relay's (or the floor's) statements alone: the
	// writers' (writerStmts a commit) and the bench's own taken out.
	OwnStmtPerMsg float64 `json:"own_statements_per_msg,omitempty"`
	// Floor names the floor a floor row measures (livefloor.go): A or B.
	Floor string `json:"floor,omitempty"`
	// VsFloors are a relay row's ratios to the floor rows of its rate
	// (compareWithFloors).
	VsFloors       []floorRatio `json:"vs_floors,omitempty"`
	BatchesPerMsg  float64      `json:"batches_per_msg,omitempty"`
	MsgsPerBatch   float64      `json:"msgs_per_batch,omitempty"`
	DBSessions     int          `json:"db_sessions"`
	WriterCommits  int64        `json:"writer_commits_in_window,omitempty"`
	LatencyMatched int          `json:"latency_messages,omitempty"`
}

// liveSnap is what the live group reads at each end of a window.
type liveSnap struct {
	at        time.Time
	relayCPU  time.Duration
	dbCPU     time.Duration
	sessions  int
	each      map[int]time.Duration // CPU of each live backend
	xacts     int64
	stmts     int64            // -1: pg_stat_statements not available
	byStmt    map[string]int64 // calls per statement (BENCH_LIVE_TRACE)
	published float64
	batches   float64
	own       int64 // the bench's own transactions on the live database so far
}

// liveDB is the live group's database of its own: pg_stat_database then
// counts only the relay's transactions, the writers' and the bench's
// own queries on it (counted and taken out), not those of whoever else
// uses the server.
type liveDB struct {
	name, url string
	admin     *pgxpool.Pool // the bench's queries on its server outside it (pg_stat_*, CHECKPOINT)
	pool      *pgxpool.Pool // the bench's queries on it (application_name bench-live)
	ownXacts  atomic.Int64  // transactions the bench ran on pool
	pgss      bool          // pg_stat_statements readable in it
	pgssWhy   string
}

const liveSchema = "outbox"

// openLiveDB creates and migrates the database of a set of live rows on
// the set's server.
func (b *bench) openLiveDB(ctx context.Context, set *liveSet, what string) (*liveDB, func(), error) {
	d := &liveDB{name: fmt.Sprintf("%s%s_%d", schemaPrefix, what, os.Getpid()), admin: set.admin}
	if _, err := d.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{d.name}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("create a database of its own: %w", err)
	}
	drop := func() {
		_, _ = d.admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)")
	}
	u, err := url.Parse(set.url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	u.Path = "/" + d.name
	d.url = u.String()
	pc, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	pc.MaxConns = 2
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-live"
	if d.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		drop()
		return nil, nil, err
	}
	cleanup := func() { d.pool.Close(); drop() }
	if _, err := migrations.Apply(ctx, d.pool, liveSchema); err != nil {
		cleanup()
		return nil, nil, err
	}
	if _, err := d.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		d.pgssWhy = shorten(err.Error())
	} else if _, err := d.pool.Exec(ctx, "SELECT 1 FROM pg_stat_statements LIMIT 1"); err != nil {
		d.pgssWhy = shorten(err.Error())
	} else {
		d.pgss = true
	}
	return d, cleanup, nil
}

// counters is the start of a window with no process to follow yet: the
// database's transactions and statements so far (those of the migrations
// and of a backlog's load then stay out of it).
func (d *liveDB) counters(ctx context.Context) (liveSnap, error) {
	s := liveSnap{stmts: -1}
	if err := d.admin.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", d.name).Scan(&s.xacts); err != nil {
		return s, err
	}
	if d.pgss {
		d.ownXacts.Add(1)
		if err := d.pool.QueryRow(ctx, stmtCountSQL).Scan(&s.stmts); err != nil {
			s.stmts = -1
		}
	}
	s.own = d.ownXacts.Load()
	return s, nil
}

// exec runs one statement on the live database, counting its transaction.
func (d *liveDB) exec(ctx context.Context, sql string, args ...any) error {
	d.ownXacts.Add(1)
	_, err := d.pool.Exec(ctx, sql, args...)
	return err
}

// empty reports whether the outbox is empty (one counted transaction).
func (d *liveDB) empty(ctx context.Context) (bool, error) {
	d.ownXacts.Add(1)
	var e bool
	err := d.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+migrations.Ident(liveSchema)+".messages)").Scan(&e)
	return e, err
}

// waitLanes waits until the relay owns all 256 lanes.
func (d *liveDB) waitLanes(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var n int
		d.ownXacts.Add(1)
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+migrations.Ident(liveSchema)+".lanes WHERE owner IS NOT NULL AND lease_until > now()").Scan(&n); err != nil {
			return err
		}
		if n == 256 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of 256 lanes owned after %s", n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procCPU is the CPU time (utime + stime) of process pid, from /proc.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// backendCPU follows the CPU time of a database's backends whose
// application_name starts with a prefix. It samples every 250ms so that
// a backend that ends between two snapshots loses at most that much.
type backendCPU struct {
	b            *bench
	admin        *pgxpool.Pool // on the database's server, outside the database
	dbs          []string      // the databases whose backends count
	app          string
	mu           sync.Mutex
	last         map[int]time.Duration
	query        map[int]string // each backend's last statement seen (not BEGIN or COMMIT)
	gone         time.Duration  // last-seen CPU of the backends that ended
	live         int
	stop         chan struct{}
	done         chan struct{}
	warnedUnread bool
}

func (b *bench) followBackends(admin *pgxpool.Pool, db, app string) *backendCPU {
	return b.followBackendsIn(admin, []string{db}, app)
}

// followBackendsIn follows the backends of several databases at once.
func (b *bench) followBackendsIn(admin *pgxpool.Pool, dbs []string, app string) *backendCPU {
	c := &backendCPU{b: b, admin: admin, dbs: dbs, app: app, last: map[int]time.Duration{}, query: map[int]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				_ = c.sample(context.Background())
			}
		}
	}()
	return c
}

func (c *backendCPU) close() { close(c.stop); <-c.done }

// sample reads the backends' pids (from the bench's own database, so as
// not to count in the measured one) and their CPU times.
func (c *backendCPU) sample(ctx context.Context) error {
	rows, err := c.admin.Query(ctx, "SELECT pid, left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 60) FROM pg_stat_activity WHERE datname = ANY($1) AND starts_with(application_name, $2)", c.dbs, c.app)
	if err != nil {
		return err
	}
	type session struct {
		PID   int32
		Query string
	}
	pids, err := pgx.CollectRows(rows, pgx.RowToStructByPos[session])
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[int]bool{}
	for _, sess := range pids {
		p := sess.PID
		if q := sess.Query; q != "" && q != "COMMIT" && q != "BEGIN" {
			c.query[int(p)] = q
		}
		cpu, err := procCPU(int(p))
		if err != nil {
			if !c.warnedUnread && !errors.Is(err, os.ErrNotExist) {
				c.warnedUnread = true
				c.b.log.Warn("cannot read a database backend's CPU from /proc (is Postgres on this host?)", "pid", p, "error", err)
			}
			continue
		}
		seen[int(p)] = true
		c.last[int(p)] = cpu
	}
	for p, cpu := range c.last {
		if !seen[p] {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err != nil {
				c.gone += cpu
				delete(c.last, p)
			}
		}
	}
	c.live = len(seen)
	return nil
}

// total is the CPU time of every backend seen so far, sampled now, and
// each live one's.
func (c *backendCPU) total(ctx context.Context) (time.Duration, map[int]time.Duration, error) {
	if err := c.sample(ctx); err != nil {
		return 0, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.gone
	each := map[int]time.Duration{}
	for p, cpu := range c.last {
		t += cpu
		each[p] = cpu
	}
	return t, each, nil
}

// sessions describes the backends' CPU between two snapshots, most first:
// pid, CPU in ms, and the last statement each was seen running.
func (c *backendCPU) sessions(s0, s1 liveSnap) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	type use struct {
		pid int
		cpu time.Duration
	}
	var us []use
	for p, cpu := range s1.each {
		us = append(us, use{p, cpu - s0.each[p]})
	}
	sort.Slice(us, func(i, j int) bool { return us[i].cpu > us[j].cpu })
	var parts []string
	for _, u := range us {
		q := c.query[u.pid]
		if q == "" {
			q = "?"
		}
		parts = append(parts, fmt.Sprintf("%d ms `%s`", u.cpu.Milliseconds(), strings.ReplaceAll(q, "|", "/")))
	}
	return "database sessions' CPU in the window (last statement seen): " + strings.Join(parts, ", ")
}

// scrapeMetrics sums the samples of the named metrics (all label sets)
// on a relay's /metrics. A name with labels, as exposed
// (`name{label="value"}`), is that series alone.
func scrapeMetrics(ctx context.Context, addr string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		name, series := l[:strings.IndexAny(l, "{ ")], l[:max(sp, 0)]
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			continue
		}
		if want[name] {
			got[name] += v
		}
		if series != name && want[series] {
			got[series] += v
		}
	}
	return got, sc.Err()
}

const (
	metricPublished = "outbox_relay_messages_published_total"
	// Observed once per claim that returned rows (relayprom's Batch hook):
	// empty claims are not exported.
	metricBatches = "outbox_relay_claim_duration_seconds_count"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// liveRelay is the relay process of the live group and what follows its
// cost.
type liveRelay struct {
	p     *relayProc
	admin string
	db    *liveDB
	be    *backendCPU
}

// startLiveRelay starts the relay binary with default settings (the
// bench's --workers and --batch-size, the defaults unless BENCH_WORKERS
// says otherwise) on the live database, its admin listener on a free
// port, and waits until it owns every lane and answers on /metrics.
func (b *bench) startLiveRelay(ctx context.Context, d *liveDB, sinkURL string, extra ...string) (*liveRelay, error) {
	lr, err := b.spawnLiveRelay(ctx, d, sinkURL, extra...)
	if err != nil {
		return nil, err
	}
	if err := lr.ready(ctx); err != nil {
		lr.stop()
		return nil, err
	}
	return lr, nil
}

// spawnLiveRelay starts the relay and returns at once.
func (b *bench) spawnLiveRelay(ctx context.Context, d *liveDB, sinkURL string, extra ...string) (*liveRelay, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := append([]string{"--database-url", d.url, "--admin-addr", addr}, extra...)
	p, err := b.startRelay(ctx, liveSchema, sinkURL, nil, args...)
	if err != nil {
		return nil, err
	}
	return &liveRelay{p: p, admin: addr, db: d, be: b.followBackends(d.admin, d.name, "outbox-relay")}, nil
}

// ready waits until the relay owns every lane and answers on /metrics.
func (lr *liveRelay) ready(ctx context.Context) error {
	if err := lr.db.waitLanes(ctx, 20*time.Second); err != nil {
		return fmt.Errorf("%w; relay stderr: %s", err, lr.p.stderr)
	}
	return lr.answers(ctx)
}

// answers waits (up to 10 s) until the process answers on /metrics.
func (lr *liveRelay) answers(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := scrapeMetrics(ctx, lr.admin, metricPublished); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("/metrics on %s: %w; the process's stderr: %s", lr.admin, err, lr.p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (lr *liveRelay) stop() { lr.be.close(); lr.p.stop() }

func (lr *liveRelay) snap(ctx context.Context, b *bench) (liveSnap, error) {
	s := liveSnap{at: time.Now(), stmts: -1}
	var err error
	if s.relayCPU, err = lr.p.CPUTime(); err != nil {
		return s, fmt.Errorf("relay CPU: %w", err)
	}
	if s.dbCPU, s.each, err = lr.be.total(ctx); err != nil {
		return s, fmt.Errorf("backends' CPU: %w", err)
	}
	s.sessions = len(s.each)
	if err := lr.db.admin.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", lr.db.name).Scan(&s.xacts); err != nil {
		return s, err
	}
	if lr.db.pgss {
		lr.db.ownXacts.Add(1)
		if err := lr.db.pool.QueryRow(ctx, stmtCountSQL).Scan(&s.stmts); err != nil {
			s.stmts = -1
		}
		if os.Getenv("BENCH_LIVE_TRACE") == "1" {
			lr.db.ownXacts.Add(1)
			if s.byStmt, err = stmtCalls(ctx, lr.db.pool); err != nil {
				return s, err
			}
		}
	}
	s.own = lr.db.ownXacts.Load()
	m, err := scrapeMetrics(ctx, lr.admin, metricPublished, metricBatches)
	if err != nil {
		return s, err
	}
	s.published, s.batches = m[metricPublished], m[metricBatches]
	return s, nil
}

// stmtCountSQL reads the calls of every statement of the live database
// so far (one statement, counted with the bench's own).
const stmtCountSQL = "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"

// writerStmts is what pg_stat_statements counts of a writer's commit:
// BEGIN, the INSERT, COMMIT (BENCH_LIVE_TRACE=1 shows the INSERT once a
// message).
const writerStmts = 3

// fill computes st's per-message figures from two snapshots; writers is
// how many transactions the writers committed between them (the bench's
// own are in the snapshots: one statement each, the snapshots' reads of
// pg_stat_statements included).
func (st *liveStats) fill(s0, s1 liveSnap, writers int64) {
	others := writers + s1.own - s0.own
	el := s1.at.Sub(s0.at).Seconds()
	st.WindowS = el
	n := int64(s1.published - s0.published)
	st.Messages = n
	relay, db := (s1.relayCPU - s0.relayCPU).Seconds(), (s1.dbCPU - s0.dbCPU).Seconds()
	st.RelayCores, st.DBCores = relay/el, db/el
	st.DBSessions = s1.sessions
	tx := float64(s1.xacts - s0.xacts - others)
	st.TxPerS = tx / el
	if n > 0 {
		st.Achieved = float64(n) / el
		st.RelayCPUUs, st.DBCPUUs = relay*1e6/float64(n), db*1e6/float64(n)
		st.TxPerMsg = tx / float64(n)
		st.BatchesPerMsg = (s1.batches - s0.batches) / float64(n)
		if b := s1.batches - s0.batches; b > 0 {
			st.MsgsPerBatch = float64(n) / b
		}
		if s0.stmts >= 0 && s1.stmts >= 0 {
			st.StmtPerMsg = float64(s1.stmts-s0.stmts) / float64(n)
			st.OwnStmtPerMsg = float64(s1.stmts-s0.stmts-writerStmts*writers-(s1.own-s0.own)) / float64(n)
		}
	}
}

// liveRates are the offered rates of the live group.
var liveRates = []float64{100, 1000, 5000}

// liveChoice narrows the live group to the comma-separated values of the
// environment variable name (BENCH_LIVE_SINKS, BENCH_LIVE_RATES), for an
// A/B run of one row; unset, all of all.
func liveChoice[T comparable](name string, all []T, parse func(string) (T, error)) []T {
	v := os.Getenv(name)
	if v == "" {
		return all
	}
	var out []T
	for _, f := range strings.Split(v, ",") {
		x, err := parse(strings.TrimSpace(f))
		if err == nil && slices.Contains(all, x) {
			out = append(out, x)
		}
	}
	return out
}

// live runs the live group into the discard sink, into Kafka (kfake) and NATS,
// on the shared server and, with BENCH_LIVE_WAL, on a throwaway logical
// cluster (livewal.go). The sets of one sink run one after the other
// before the next sink's, so that a slow patch of the machine hits the
// sets alike.
func (b *bench) live(ctx context.Context) error {
	var sets []*liveSet
	if b.cfg.liveWAL != "only" {
		sets = append(sets, b.sharedLiveSet())
	}
	if b.cfg.liveWAL != "" {
		logical, closeCluster, err := b.logicalLiveSets(ctx)
		if err != nil {
			b.liveFailed(&liveSet{label: "throwaway cluster, wal_level = logical"}, "live", err)
		} else {
			defer closeCluster()
			sets = append(sets, logical...)
		}
	}
	var ready []*liveSet
	for _, set := range sets {
		what := "live"
		if set.wakeup != "" {
			what += "_" + set.wakeup
		}
		d, cleanup, err := b.openLiveDB(ctx, set, what)
		if err != nil {
			b.liveFailed(set, "live", err)
			continue
		}
		defer cleanup()
		set.db = d
		ready = append(ready, set)
	}
	recv, err := newReceiver()
	if err != nil {
		return err
	}
	defer recv.close()
	all := []string{"discard", "kafka"}
	if b.cfg.natsURL != "off" {
		all = append(all, "nats")
	}
	sinkNames := liveChoice("BENCH_LIVE_SINKS", all, func(s string) (string, error) { return s, nil })
	for _, sink := range sinkNames {
		for _, set := range ready {
			if err := b.liveSink(ctx, set, recv, sink); err != nil {
				b.liveFailed(set, sink, err)
			}
		}
		if sink != "discard" {
			continue
		}
		for _, set := range ready {
			if err := b.liveFloor(ctx, set, recv, set.discardDrain); err != nil {
				b.liveFailed(set, set.floor().name, err)
			}
		}
	}
	compareWithFloors(b.rep.Rows, ready)
	return nil
}

// liveFailed adds the row that says why a set's rows of a sink (or all of
// them) are missing.
func (b *bench) liveFailed(set *liveSet, sink string, err error) {
	b.log.Warn("live group failed", "set", set.label, "sink", sink, "error", err)
	r := &row{Group: "live", Name: set.rowName(sink, "failed"), Live: &liveStats{Set: set.label, Sink: sink, Load: "failed"}}
	r.addNote("%v", shorten(err.Error()))
	b.rep.add(r)
}

// liveSink runs a set's rows of one sink: the drain yardstick, idle, and
// each of liveRates, all with one relay process.
func (b *bench) liveSink(ctx context.Context, set *liveSet, recv *receiver, sink string) error {
	d := set.db
	sinkURL, stopSink := "discard", func() {}
	consumer := map[string]func(context.Context, *receiver) (string, func(), error){"kafka": b.kafkaConsumer, "nats": b.natsConsumer}[sink]
	if consumer != nil {
		u, stop, err := consumer(ctx, recv)
		if err != nil {
			return err
		}
		sinkURL, stopSink = u, stop
	}
	defer stopSink()
	// The yardstick: a backlog of 100k, loaded and vacuumed before the
	// relay starts (as the drain rows do), drained by the process that
	// then serves the live rates; from the process's start (its CPU and
	// its backends' at 0) to the outbox seen empty (polled every 10ms).
	recv.reset(0)
	if err := d.exec(ctx, b.backlogSQL(liveSchema, liveDrainN, b.cfg.keys)); err != nil {
		return err
	}
	if err := d.exec(ctx, "VACUUM ANALYZE "+migrations.Ident(liveSchema)+".messages"); err != nil {
		return err
	}
	b.checkpointOn(ctx, d.admin)
	s0, err := d.counters(ctx)
	if err != nil {
		return err
	}
	lr, err := b.spawnLiveRelay(ctx, d, sinkURL, set.relayArgs()...)
	if err != nil {
		return err
	}
	defer lr.stop()
	s0.at = lr.p.Started()
	window := b.liveWindow()
	pgssNote := "statements: pg_stat_statements not available (" + d.pgssWhy + "); transactions from pg_stat_database"
	if d.pgss {
		pgssNote = "statements: pg_stat_statements calls of every session of the database, the writers' included"
	}
	add := func(st *liveStats, p50, p99 float64, notes ...string) error {
		if err := lr.checkWakeup(ctx, set); err != nil {
			return fmt.Errorf("%s: %w", st.Load, err)
		}
		st.Set = set.label
		r := &row{Group: "live", Name: set.rowName(sink, st.Load), Live: st, Messages: int(st.Messages), PayloadBytes: b.cfg.payload,
			Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: 1, Runs: 1, P50: p50, P99: p99}
		for _, n := range notes {
			r.addNote("%s", n)
		}
		b.rep.add(r)
		b.log.Info("live", "set", set.label, "sink", sink, "load", st.Load, "msg_per_s", int(st.Achieved), "relay_us_per_msg", int(st.RelayCPUUs),
			"db_us_per_msg", int(st.DBCPUUs), "relay_x", st.RelayX, "db_x", st.DBX, "relay_cores", st.RelayCores, "db_cores", st.DBCores,
			"tx_per_msg", st.TxPerMsg, "batches_per_msg", st.BatchesPerMsg, "p50_ms", p50, "p99_ms", p99)
		return nil
	}
	drain := &liveStats{Sink: sink, Load: fmt.Sprintf("draining %dk (yardstick)", liveDrainN/1000)}
	for {
		e, err := d.empty(ctx)
		if err != nil {
			return err
		}
		if e {
			break
		}
		if !lr.p.Alive() {
			return fmt.Errorf("relay exited: %s", lr.p.stderr)
		}
		if time.Since(s0.at) > 5*time.Minute {
			return fmt.Errorf("backlog not drained in 5 min; relay stderr: %s", lr.p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The last batch's metrics are recorded after its commit.
	for range 200 {
		if m, err := scrapeMetrics(ctx, lr.admin, metricPublished); err == nil && m[metricPublished] >= liveDrainN {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	s1, err := lr.snap(ctx, b)
	if err != nil {
		return err
	}
	drain.fill(s0, s1, 0)
	if sink != "discard" && !recv.waitCount(ctx, liveDrainN, 30*time.Second) {
		return fmt.Errorf("%s consumer got %d of %d drained messages", sink, recv.count.Load(), liveDrainN)
	}
	if err := lr.ready(ctx); err != nil {
		return err
	}
	if sink == "discard" {
		set.discardDrain = drain
	}
	if err := add(drain, 0, 0, fmt.Sprintf("%d messages loaded and vacuumed before the relay started; clock and CPU from the process's start (start-up included) to the outbox seen empty", liveDrainN),
		"transactions per message may count the drain's last ones only partly (a backend reports to pg_stat_database at most once a second)", lr.be.sessions(s0, s1)); err != nil {
		return err
	}

	// Idle: nothing written. Settle first (the drain's stats, autovacuum).
	time.Sleep(3 * time.Second)
	s0, err = lr.snap(ctx, b)
	if err != nil {
		return err
	}
	time.Sleep(window)
	s1, err = lr.snap(ctx, b)
	if err != nil {
		return err
	}
	idle := &liveStats{Sink: sink, Load: "idle"}
	idle.fill(s0, s1, 0)
	if err := add(idle, 0, 0, fmt.Sprintf("%s with nothing written; cores = CPU seconds per second", window.Round(time.Second)),
		"transactions/s from pg_stat_database lag up to 10 s for idle backends", lr.be.sessions(s0, s1)); err != nil {
		return err
	}

	rates := liveChoice("BENCH_LIVE_RATES", liveRates, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	for _, rate := range rates {
		st, p50, p99, notes, err := b.liveRate(ctx, lr, recv, sink, rate, window)
		if err != nil {
			return fmt.Errorf("%.0f msg/s: %w", rate, err)
		}
		if drain.RelayCPUUs > 0 {
			st.RelayX = st.RelayCPUUs / drain.RelayCPUUs
		}
		if drain.DBCPUUs > 0 {
			st.DBX = st.DBCPUUs / drain.DBCPUUs
		}
		if err := add(st, p50, p99, append(notes, pgssNote)...); err != nil {
			return err
		}
	}
	return nil
}

// liveWindow is how long each live row measures.
func (b *bench) liveWindow() time.Duration {
	if b.cfg.quick {
		return 10 * time.Second
	}
	return 30 * time.Second
}

// liveWriters is how many application connections offer the live load.
const liveWriters = 16

// liveRate offers rate single-message transactions a second, open loop,
// for 1s of warm-up, the window, and 0.5s after it; the window's
// snapshots are taken while the load runs. Latency covers every message
// of the run (Kafka and NATS: the discard sink has no consumer).
func (b *bench) liveRate(ctx context.Context, lr *liveRelay, recv *receiver, sink string, rate float64, window time.Duration) (*liveStats, float64, float64, []string, error) {
	const warm, tail = time.Second, 500 * time.Millisecond
	total := warm + window + tail
	capacity := int(rate*total.Seconds()) + 1
	recv.reset(capacity)
	commits := make([]atomic.Int64, capacity)
	pc, err := pgxpool.ParseConfig(lr.db.url)
	if err != nil {
		return nil, 0, 0, nil, err
	}
	pc.MaxConns, pc.MinConns = liveWriters, liveWriters
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-writer"
	app, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, 0, 0, nil, err
	}
	defer app.Close()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: liveSchema})
	if err != nil {
		return nil, 0, 0, nil, err
	}
	// Open the connections before the clock starts (their transactions
	// are not in any window).
	if err := app.Ping(ctx); err != nil {
		return nil, 0, 0, nil, err
	}
	var (
		next, written atomic.Int64
		wg            sync.WaitGroup
		errOnce       sync.Once
		werr          error
	)
	period := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	end := start.Add(total)
	for range liveWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				due := start.Add(time.Duration(i) * period)
				if i >= int64(capacity) || due.After(end) || time.Now().After(end) {
					// Open loop, but not past the end: writers that fell
					// behind leave the rest unwritten.
					return
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
					return w.Write(ctx, tx, outbox.Message{Topic: "bench", Key: fmt.Sprintf("key-%d", i%int64(b.cfg.keys)), Payload: payloadGo(i, b.cfg.payload)})
				})
				if err != nil {
					errOnce.Do(func() { werr = err })
					return
				}
				commits[i].Store(time.Now().UnixNano())
				written.Add(1)
			}
		}()
	}
	st := &liveStats{Sink: sink, Load: fmt.Sprintf("%.0f msg/s", rate), Offered: rate}
	time.Sleep(time.Until(start.Add(warm)))
	s0, err := lr.snap(ctx, b)
	w0 := written.Load()
	if err != nil {
		return nil, 0, 0, nil, err
	}
	time.Sleep(time.Until(start.Add(warm + window)))
	s1, err := lr.snap(ctx, b)
	w1 := written.Load()
	if err != nil {
		return nil, 0, 0, nil, err
	}
	wg.Wait()
	elapsed := time.Since(start)
	if werr != nil {
		return nil, 0, 0, nil, werr
	}
	st.WriterCommits = w1 - w0
	st.fill(s0, s1, st.WriterCommits)
	traceStatements(b, st, s0, s1)
	n := written.Load()
	notes := []string{fmt.Sprintf("%d writers offering single-message transactions open loop; %d committed in %s (%.0f/s); window %s in the middle of it",
		liveWriters, n, elapsed.Round(100*time.Millisecond), float64(n)/elapsed.Seconds(), window), fmt.Sprintf("%d writer commits in the window taken out of the transactions", st.WriterCommits),
		lr.be.sessions(s0, s1)}
	if sink == "discard" {
		// Wait for delivery all the same, so the next rate starts clean.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if e, err := lr.db.empty(ctx); err == nil && e {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return st, 0, 0, notes, nil
	}
	if !recv.waitCount(ctx, n, 30*time.Second) {
		return nil, 0, 0, nil, fmt.Errorf("%s consumer got %d of %d", sink, recv.count.Load(), n)
	}
	var lat []float64
	for i := range capacity {
		c, a := commits[i].Load(), recv.arrivals[i].Load()
		if c == 0 || a == 0 {
			continue
		}
		lat = append(lat, max(0, float64(a-c)/1e6))
	}
	if len(lat) == 0 {
		return st, 0, 0, notes, nil
	}
	sort.Float64s(lat)
	st.LatencyMatched = len(lat)
	if v := recv.orderViolations(); v > 0 {
		notes = append(notes, fmt.Sprintf("%d per-key order violations", v))
	}
	return st, percentile(lat, 50), percentile(lat, 99), notes, nil
}

// profileLive (BENCH_PROFILE=live) takes a 20 s CPU profile of the relay
// binary (run --pprof) relaying 100 single-message transactions a second
// (BENCH_PROFILE_RATE to change it) into the discard sink, and prints the
// top 25 functions by flat and by cumulative time. Output goes to
// results/profile-live-<rate>.{pprof,md}.
func (b *bench) profileLive(ctx context.Context) error {
	const seconds = 20
	rate := 100
	if v := os.Getenv("BENCH_PROFILE_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("BENCH_PROFILE_RATE: %q is not a positive number of messages a second", v)
		}
		rate = n
	}
	if err := os.MkdirAll(b.cfg.outDir, 0o755); err != nil {
		return err
	}
	d, cleanup, err := b.openLiveDB(ctx, b.sharedLiveSet(), "liveprof")
	if err != nil {
		return err
	}
	defer cleanup()
	recv, err := newReceiver()
	if err != nil {
		return err
	}
	defer recv.close()
	lr, err := b.startLiveRelay(ctx, d, "discard", "--pprof")
	if err != nil {
		return err
	}
	defer lr.stop()
	type result struct {
		st    *liveStats
		notes []string
		err   error
	}
	done := make(chan result, 1)
	go func() {
		// Warm-up 1s, then the window the profile covers.
		st, _, _, notes, err := b.liveRate(ctx, lr, recv, "discard", float64(rate), seconds*time.Second)
		done <- result{st, notes, err}
	}()
	time.Sleep(time.Second)
	prof := fmt.Sprintf("%s/profile-live-%d.pprof", b.cfg.outDir, rate)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", lr.admin, seconds), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("relay's /debug/pprof/profile: %s (a relay binary without run --pprof?)", resp.Status)
	}
	f, err := os.Create(prof)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	res := <-done
	if res.err != nil {
		return res.err
	}
	var out strings.Builder
	st := res.st
	fmt.Fprintf(&out, "# CPU profile of the relay at %d msg/s (discard sink, default settings)\n\n", rate)
	fmt.Fprintf(&out, "Profile: %s, %d s (`go tool pprof -http : %s` to browse it).\n\n", prof, seconds, prof)
	fmt.Fprintf(&out, "In the window (profiling on): %.0f msg/s delivered; relay %.0f µs CPU a message (%.3f of a core), its database sessions %.0f µs (%.3f of a core); %.2f relay transactions and %.3f batches a message.\n\n",
		st.Achieved, st.RelayCPUUs, st.RelayCores, st.DBCPUUs, st.DBCores, st.TxPerMsg, st.BatchesPerMsg)
	for _, n := range res.notes {
		fmt.Fprintf(&out, "- %s\n", n)
	}
	fmt.Fprintln(&out)
	for _, mode := range [][]string{{"-top"}, {"-top", "-cum"}} {
		args := append([]string{"tool", "pprof", "-nodecount=25"}, mode...)
		args = append(args, prof)
		cmd := exec.CommandContext(ctx, "go", args...)
		top, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, top)
		}
		fmt.Fprintf(&out, "## go tool pprof %s\n\n```\n%s```\n\n", strings.Join(mode, " "), top)
	}
	fmt.Println(out.String())
	return os.WriteFile(fmt.Sprintf("%s/profile-live-%d.md", b.cfg.outDir, rate), []byte(out.String()), 0o644)
}

// stmtCalls reads the calls of each statement of the live database
// (BENCH_LIVE_TRACE=1), by its text's first 100 characters.
func stmtCalls(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 100), sum(calls)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		out[q] += n
	}
	return out, rows.Err()
}

// traceStatements logs the statements of a live row's window, calls per
// delivered message, most called first (BENCH_LIVE_TRACE=1).
func traceStatements(b *bench, st *liveStats, s0, s1 liveSnap) {
	if s0.byStmt == nil || s1.byStmt == nil || st.Messages == 0 {
		return
	}
	type call struct {
		q string
		n int64
	}
	var calls []call
	for q, n := range s1.byStmt {
		if d := n - s0.byStmt[q]; d > 0 {
			calls = append(calls, call{q, d})
		}
	}
	slices.SortFunc(calls, func(a, b call) int { return int(b.n - a.n) })
	for _, c := range calls[:min(len(calls), 12)] {
		b.log.Info("statement", "load", st.Load, "per_msg", fmt.Sprintf("%.3f", float64(c.n)/float64(st.Messages)), "query", c.q)
	}
}
