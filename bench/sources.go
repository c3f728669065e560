package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// The sources group: one relay process relaying from many outboxes (a
// sources list in its config file, `run --wakeup poll`). What an idle
// source costs, against a relay of one database in the same run and at
// the same time; and whether one source's backlog or stopped database
// raises the other sources' commit → webhook latency (sourceslat.go).
// Everything runs on throwaway clusters (pgtest.Start): 50 sources hold
// more sessions than the shared server's max_connections allows, and
// the stopped database must be one the bench may stop.

const (
	srcIdleN  = 50 // idle sources of the many-sources row
	srcSchema = "outbox"
	srcAppPfx = "outbox-relay" // the relay's application_name prefix
)

// srcCluster is a throwaway cluster of the group and the bench's admin
// pool on it (database postgres, application_name bench-admin).
type srcCluster struct {
	srv   *pgtest.Instance
	admin *pgxpool.Pool
}

// srcDB is a migrated database of a srcCluster.
type srcDB struct {
	name, url string
}

// srcIdleStats is an idle row of the group: medians over the windows.
type srcIdleStats struct {
	Sources     int       `json:"sources"` // 0: a relay of one database (--database-url)
	WindowS     float64   `json:"window_s"`
	RelayCores  float64   `json:"relay_cores"`
	DBCores     float64   `json:"db_cores"`
	TxPerS      float64   `json:"tx_per_s"`
	Sessions    int       `json:"db_sessions"`
	PerSource   float64   `json:"relay_cores_per_source"`
	DBPerSource float64   `json:"db_cores_per_source"`
	XSingle     float64   `json:"relay_per_source_x_single,omitempty"`
	DBXSingle   float64   `json:"db_per_source_x_single,omitempty"`
	RelayRuns   []float64 `json:"relay_cores_per_run"`
}

// sourcesTimes are the group's settle time and idle and latency windows.
func (b *bench) sourcesTimes() (settle, idle, lat time.Duration) {
	if b.cfg.quick {
		return 12 * time.Second, 20 * time.Second, 10 * time.Second
	}
	// Settle past the sources' one-minute idle connection time.
	return 65 * time.Second, 30 * time.Second, 30 * time.Second
}

// sources runs the group: the idle rows, then the latency rows.
func (b *bench) sources(ctx context.Context) error {
	a, err := b.startSrcCluster(ctx, "max_connections = 500")
	if err != nil {
		r := &row{Group: "sources", Name: "sources group"}
		r.addNote("no throwaway cluster: %v", shorten(err.Error()))
		b.rep.add(r)
		return nil
	}
	defer a.close(b)
	if os.Getenv("BENCH_SRC_NOIDLE") != "" {
		return b.sourcesLatency(ctx, a)
	}
	if err := b.sourcesIdle(ctx, a); err != nil {
		return err
	}
	return b.sourcesLatency(ctx, a)
}

// startSrcCluster starts a throwaway cluster with the extra
// postgresql.conf lines conf.
func (b *bench) startSrcCluster(ctx context.Context, conf ...string) (*srcCluster, error) {
	srv, err := pgtest.Start(ctx, append([]string{"# outbox-relay bench, group sources"}, conf...)...)
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(srv.URL())
	if err != nil {
		_ = srv.Close()
		return nil, err
	}
	pc.MaxConns = 4
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-admin"
	admin, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		_ = srv.Close()
		return nil, err
	}
	b.log.Info("sources group: throwaway cluster", "url", srv.URL(), "conf", conf)
	return &srcCluster{srv: srv, admin: admin}, nil
}

// close removes the cluster, its databases with it.
func (c *srcCluster) close(b *bench) {
	c.admin.Close()
	if err := c.srv.Close(); err != nil {
		b.log.Warn("removing the sources group's throwaway cluster", "error", err)
	}
}

// dbURL is the URL of database name on the cluster.
func (c *srcCluster) dbURL(name string) string {
	u, err := url.Parse(c.srv.URL())
	if err != nil {
		return c.srv.URL()
	}
	u.Path = "/" + name
	return u.String()
}

// createDBs creates n migrated databases named after what: the first is
// migrated, the others are copies of it (CREATE DATABASE … TEMPLATE).
func (c *srcCluster) createDBs(ctx context.Context, what string, n int) ([]srcDB, error) {
	var dbs []srcDB
	for i := range n {
		name := fmt.Sprintf("%s%s_%d_%02d", schemaPrefix, what, os.Getpid(), i)
		sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
		if i > 0 {
			sql += " TEMPLATE " + pgx.Identifier{dbs[0].name}.Sanitize()
		}
		if _, err := c.admin.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("create database %s: %w", name, err)
		}
		dbs = append(dbs, srcDB{name: name, url: c.dbURL(name)})
		if i == 0 {
			if err := c.migrate(ctx, dbs[0]); err != nil {
				return nil, err
			}
		}
	}
	return dbs, nil
}

// migrate migrates db's outbox schema.
func (c *srcCluster) migrate(ctx context.Context, db srcDB) error {
	pool, err := pgxpool.New(ctx, db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = migrations.Apply(ctx, pool, srcSchema)
	return err
}

// sourcesConfig writes a config file whose sources list names dbs
// (<what>-00, <what>-01, …) and returns its path and the names.
func (b *bench) sourcesConfig(what string, dbs []srcDB) (string, []string, error) {
	var s strings.Builder
	s.WriteString("# outbox-relay bench, group sources\nsources:\n")
	var names []string
	for i, db := range dbs {
		name := fmt.Sprintf("%s-%02d", what, i)
		names = append(names, name)
		fmt.Fprintf(&s, "  - name: %s\n    database-url: %s\n", name, db.url)
	}
	path := filepath.Join(b.tmp, fmt.Sprintf("sources-%s-%d.yaml", what, b.seq.Add(1)))
	return path, names, os.WriteFile(path, []byte(s.String()), 0o600)
}

// sourcesEnv is the bench's environment without a database URL, which a
// sources list refuses beside it.
func sourcesEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL") && !strings.HasPrefix(kv, "OUTBOX_DATABASE_URL") {
			env = append(env, kv)
		}
	}
	return env
}

// srcProc is one relay process of the group: a relay of one database
// (names nil) or of a sources list.
type srcProc struct {
	p     *relayProc
	admin string   // its admin listener
	names []string // its sources
	dbs   []string // their databases
	be    *backendCPU
}

// startSrcProc starts `outbox-relay run --wakeup poll` into sinkURL on
// dbs: with a sources list of what-00… when list is set, else with
// --database-url (one database). Its sessions on c are followed (c nil:
// not followed).
func (b *bench) startSrcProc(ctx context.Context, c *srcCluster, what string, list bool, dbs []srcDB, sinkURL string) (*srcProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	sp := &srcProc{admin: addr}
	args := []string{"--wakeup", "poll", "--admin-addr", addr}
	if v := os.Getenv("BENCH_SRC_ARGS"); v != "" {
		args = append(args, strings.Fields(v)...)
	}
	if v := os.Getenv("BENCH_SRC_LOADED_ARGS"); v != "" && what == "lat" && !list {
		// The latency rows' control: the relay of the loaded source alone.
		args = append(args, strings.Fields(v)...)
	}
	if list {
		path, names, err := b.sourcesConfig(what, dbs)
		if err != nil {
			return nil, err
		}
		sp.names = names
		args = append(args, "--config", path)
	} else {
		args = append(args, "--database-url", dbs[0].url)
	}
	for _, db := range dbs {
		sp.dbs = append(sp.dbs, db.name)
	}
	if sp.p, err = b.startRelayEnv(ctx, sourcesEnv(), srcSchema, sinkURL, nil, args...); err != nil {
		return nil, err
	}
	if c != nil {
		sp.be = b.followBackendsIn(c.admin, sp.dbs, srcAppPfx)
	}
	return sp, nil
}

func (sp *srcProc) stop() {
	if sp.be != nil {
		sp.be.close()
	}
	sp.p.stop()
}

// ready waits (up to limit) until the process answers on /metrics and,
// with a sources list, every source runs.
func (sp *srcProc) ready(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n, err := sp.running(ctx)
		if err == nil && n >= len(sp.names) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d sources running after %s (%v); relay stderr: %s", n, len(sp.names), limit, err, sp.p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running counts the process's sources in state running (0 for a relay
// of one database), from its /metrics.
func (sp *srcProc) running(ctx context.Context) (int, error) {
	series := []string{metricPublished}
	for _, n := range sp.names {
		series = append(series, srcStateSeries(n, "running"))
	}
	m, err := scrapeMetrics(ctx, sp.admin, series...)
	if err != nil {
		return 0, err
	}
	var n int
	for _, s := range series[1:] {
		n += int(m[s])
	}
	return n, nil
}

// srcStateSeries is the series of outbox_relay_source_state of a source
// and state, as exposed.
func srcStateSeries(source, state string) string {
	return fmt.Sprintf("outbox_relay_source_state{source=%q,state=%q}", source, state)
}

// srcIdleSnap is what an idle window reads at each end.
type srcIdleSnap struct {
	at       time.Time
	relay    time.Duration
	db       time.Duration
	sessions int
	xacts    int64
}

func (sp *srcProc) snap(ctx context.Context, c *srcCluster) (srcIdleSnap, error) {
	s := srcIdleSnap{at: time.Now()}
	var err error
	if s.relay, err = sp.p.CPUTime(); err != nil {
		return s, fmt.Errorf("relay CPU: %w", err)
	}
	var each map[int]time.Duration
	if s.db, each, err = sp.be.total(ctx); err != nil {
		return s, err
	}
	s.sessions = len(each)
	err = c.admin.QueryRow(ctx, "SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1)", sp.dbs).Scan(&s.xacts)
	return s, err
}

// sourcesIdle runs the idle rows: three relay processes at once, each on
// databases of its own with nothing to do — a relay of one database (the
// yardstick), a sources list of one, a sources list of 50 — and reads
// each one's CPU, its sessions' CPU and its transactions over the same
// windows.
func (b *bench) sourcesIdle(ctx context.Context, c *srcCluster) error {
	start := time.Now()
	dbs, err := c.createDBs(ctx, "srcidle", srcIdleN+2)
	if err != nil {
		return err
	}
	b.log.Info("sources group: idle databases created", "n", len(dbs), "took", time.Since(start).Round(time.Millisecond))
	names := []string{"a relay of one database (`--database-url`): yardstick", "a sources list of 1", fmt.Sprintf("a sources list of %d", srcIdleN)}
	sets := [][]srcDB{dbs[:1], dbs[1:2], dbs[2:]}
	var procs []*srcProc
	defer func() {
		for _, sp := range procs {
			sp.stop()
		}
	}()
	for i, set := range sets {
		sp, err := b.startSrcProc(ctx, c, fmt.Sprint("idle", i), i > 0, set, "discard")
		if err != nil {
			return err
		}
		procs = append(procs, sp)
	}
	for _, sp := range procs {
		if err := sp.ready(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	settle, window, _ := b.sourcesTimes()
	b.log.Info("sources group: idle relays running; settling", "settle", settle, "window", window, "runs", b.cfg.runs)
	time.Sleep(settle)
	stats, err := b.idleWindows(ctx, c, procs, window)
	if err != nil {
		return err
	}
	b.idleRows(names, stats, settle)
	return nil
}

// idleWindows reads every process over b.cfg.runs consecutive windows.
func (b *bench) idleWindows(ctx context.Context, c *srcCluster, procs []*srcProc, window time.Duration) ([]*srcIdleStats, error) {
	type runs struct{ relay, db, tx []float64 }
	all := make([]runs, len(procs))
	stats := make([]*srcIdleStats, len(procs))
	for run := 0; run < b.cfg.runs; run++ {
		s0 := make([]srcIdleSnap, len(procs))
		for i, sp := range procs {
			var err error
			if s0[i], err = sp.snap(ctx, c); err != nil {
				return nil, err
			}
		}
		time.Sleep(window)
		for i, sp := range procs {
			s1, err := sp.snap(ctx, c)
			if err != nil {
				return nil, err
			}
			el := s1.at.Sub(s0[i].at).Seconds()
			all[i].relay = append(all[i].relay, (s1.relay-s0[i].relay).Seconds()/el)
			all[i].db = append(all[i].db, (s1.db-s0[i].db).Seconds()/el)
			all[i].tx = append(all[i].tx, float64(s1.xacts-s0[i].xacts)/el)
			stats[i] = &srcIdleStats{Sources: len(sp.names), WindowS: el, Sessions: s1.sessions}
		}
	}
	for i, st := range stats {
		st.RelayRuns = all[i].relay
		st.RelayCores, st.DBCores, st.TxPerS = median(all[i].relay), median(all[i].db), median(all[i].tx)
		n := float64(max(st.Sources, 1))
		st.PerSource, st.DBPerSource = st.RelayCores/n, st.DBCores/n
		if y := stats[0]; i > 0 && y.RelayCores > 0 && y.DBCores > 0 {
			st.XSingle, st.DBXSingle = st.PerSource/y.RelayCores, st.DBPerSource/y.DBCores
		}
	}
	return stats, nil
}

// idleRows adds the idle rows to the report.
func (b *bench) idleRows(names []string, stats []*srcIdleStats, settle time.Duration) {
	for i, st := range stats {
		r := &row{Group: "sources", Name: names[i], Processes: 1, Workers: b.cfg.workers, SrcIdle: st}
		r.Runs = len(st.RelayRuns)
		var runs []string
		for _, v := range st.RelayRuns {
			runs = append(runs, fmt.Sprintf("%.4f", v))
		}
		r.addNote("relay cores per window: %s; after %s of settling", strings.Join(runs, ", "), settle)
		b.rep.add(r)
		b.log.Info("sources idle", "row", names[i], "relay_cores", st.RelayCores, "per_source", st.PerSource,
			"db_cores", st.DBCores, "db_per_source", st.DBPerSource, "sessions", st.Sessions, "tx_per_s", st.TxPerS)
	}
}
