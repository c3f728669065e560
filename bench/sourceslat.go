package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// The sources group's latency rows: one relay process with a sources
// list of 3 quiet sources (a throwaway cluster with room for them) and a
// loaded one (a second throwaway cluster, which the bench may stop), all
// into the HTTP sink. The quiet sources get 100 single-message
// transactions a second each; their commit → webhook latency is
// measured while the loaded source is idle (alone), drains a 200k
// backlog committed just before the window (backlog), or has its
// database stopped just before the window (stopped). A control row
// (apart) drains the same backlog with a second relay process, the quiet
// sources in the first: what the two cores shared with the backlog cost
// the quiet sources without sharing a process with it. A second control
// (inert) commits the same backlog and serves the quiet sources only:
// what the backlog's commit and its database cost them with nothing
// draining it. Each row runs fresh relay processes; the cases alternate
// within each run. BENCH_SRC_CASES (a comma-separated list of the cases)
// runs some of them; BENCH_SRC_LOADED_ARGS are more arguments for the
// relay process of the loaded source alone in case apart (a rate limit,
// say).

const (
	srcQuiet     = 3             // quiet sources
	srcQuietRate = 100.0         // messages a second into each quiet source
	srcBacklogN  = 200_000       // the loaded source's backlog
	srcWriters   = 4             // writer connections per quiet source
	srcBulkN     = 2_000_000_000 // the backlog's message numbers start past it: not timed
)

// The latency rows' cases, in the order each run measures them.
var srcCases = []string{"alone", "backlog", "apart", "inert", "stopped"}

// srcLatStats is a latency row of the group.
type srcLatStats struct {
	Case     string    `json:"case"`
	Quiet    int       `json:"quiet_sources"`
	Rate     float64   `json:"offered_per_quiet_source"`
	Achieved []float64 `json:"achieved_per_s_per_run"` // all quiet sources
	WindowS  []float64 `json:"window_s_per_run"`
	// XAlone is the row's p99 over the alone row's (medians); XAloneRuns
	// each run's over the same run's alone.
	XAlone     float64   `json:"p99_x_alone,omitempty"`
	XAloneRuns []float64 `json:"p99_x_alone_per_run,omitempty"`
}

// srcLat is what the latency rows share.
type srcLat struct {
	a, lc   *srcCluster // the quiet sources' cluster and the loaded one's
	dbs     []srcDB     // the quiet sources', then the loaded one's
	writers []*pgxpool.Pool
	load    *pgxpool.Pool // on the loaded database
	recv    *receiver
	w       *outbox.Writer
	payload int
}

// sourcesLatency runs the latency rows on cluster a and a second
// throwaway cluster for the loaded source.
func (b *bench) sourcesLatency(ctx context.Context, a *srcCluster) error {
	lc, err := b.startSrcCluster(ctx)
	if err != nil {
		r := &row{Group: "sources", Name: "latency rows"}
		r.addNote("no second throwaway cluster: %v", shorten(err.Error()))
		b.rep.add(r)
		return nil
	}
	defer lc.close(b)
	st, cleanup, err := b.newSrcLat(ctx, a, lc)
	defer cleanup()
	if err != nil {
		return err
	}
	rows := map[string]*row{}
	for _, cs := range srcCases {
		rows[cs] = &row{Group: "sources", Name: srcCaseName(cs), PayloadBytes: b.cfg.payload, Batch: b.cfg.batch,
			Workers: b.cfg.workers, Processes: 1, TargetRate: srcQuietRate * srcQuiet,
			SrcLat: &srcLatStats{Case: cs, Quiet: srcQuiet, Rate: srcQuietRate}}
	}
	cases := srcCases
	if v := os.Getenv("BENCH_SRC_CASES"); v != "" {
		cases = strings.Split(v, ",")
	}
	for run := 0; run < b.cfg.runs; run++ {
		for _, cs := range cases {
			if err := b.srcLatRun(ctx, st, cs, rows[cs]); err != nil {
				b.log.Warn("sources latency run failed", "case", cs, "error", err)
				rows[cs].addNote("run %d failed: %v", run+1, shorten(err.Error()))
			}
		}
	}
	b.srcLatRows(rows)
	return nil
}

// srcCaseName names a case's row.
func srcCaseName(cs string) string {
	switch cs {
	case "alone":
		return fmt.Sprintf("%d quiet sources at %.0f msg/s each, the 4th source idle (alone)", srcQuiet, srcQuietRate)
	case "backlog":
		return fmt.Sprintf("the same while the 4th source drains a %dk backlog", srcBacklogN/1000)
	case "apart":
		return "control: the same backlog drained by a second relay process (the 3 quiet sources in the first)"
	case "inert":
		return "control: the same backlog committed and left alone (no relay serves the 4th source)"
	default:
		return "the same while the 4th source's database is stopped"
	}
}

// newSrcLat creates the databases, the writers' pools and the receiver.
func (b *bench) newSrcLat(ctx context.Context, a, lc *srcCluster) (*srcLat, func(), error) {
	st := &srcLat{a: a, lc: lc, payload: b.cfg.payload}
	cleanup := func() {
		for _, p := range st.writers {
			p.Close()
		}
		if st.load != nil {
			st.load.Close()
		}
		if st.recv != nil {
			st.recv.close()
		}
	}
	quiet, err := a.createDBs(ctx, "srcquiet", srcQuiet)
	if err != nil {
		return nil, cleanup, err
	}
	loaded, err := lc.createDBs(ctx, "srcloaded", 1)
	if err != nil {
		return nil, cleanup, err
	}
	st.dbs = append(quiet, loaded...)
	for _, db := range st.dbs {
		pc, err := pgxpool.ParseConfig(db.url)
		if err != nil {
			return nil, cleanup, err
		}
		pc.MaxConns, pc.MinConns = srcWriters, srcWriters
		pc.ConnConfig.RuntimeParams["application_name"] = "bench-writer"
		p, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, cleanup, err
		}
		st.writers = append(st.writers, p)
	}
	st.load, st.writers = st.writers[srcQuiet], st.writers[:srcQuiet]
	if st.w, err = outbox.NewWriter(outbox.WriterConfig{Schema: srcSchema}); err != nil {
		return nil, cleanup, err
	}
	st.recv, err = newReceiver()
	return st, cleanup, err
}

// write commits message n with key into source s (the loaded one is
// srcQuiet). The keys of a writer goroutine are its own, so that the
// receiver's per-key order check sees the commit order.
func (st *srcLat) write(ctx context.Context, s int, key string, n int64) error {
	pool := st.load
	if s < srcQuiet {
		pool = st.writers[s]
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := st.w.Write(ctx, tx, outbox.Message{Topic: "bench", Key: key, Payload: payloadGo(n, st.payload)}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// srcLatRun measures one case once with a fresh relay process.
func (b *bench) srcLatRun(ctx context.Context, st *srcLat, cs string, r *row) error {
	_, _, window := b.sourcesTimes()
	procs, err := b.startLatProcs(ctx, st, cs)
	stopped := false
	defer func() {
		for _, p := range procs {
			p.stop()
		}
		b.resetLoaded(ctx, st, cs, stopped)
	}()
	if err != nil {
		return err
	}
	sp := procs[0]
	capacity := srcQuiet * (int(srcQuietRate*window.Seconds()) + 1)
	if err := st.warmUp(ctx, capacity, cs != "inert"); err != nil {
		return fmt.Errorf("%w; relay stderr: %s", err, sp.p.stderr)
	}
	var early <-chan struct{}
	var drainedAt *atomic.Int64
	switch cs {
	case "backlog", "apart", "inert":
		var stopWatch func()
		if early, drainedAt, stopWatch, err = b.srcBacklog(ctx, st); err != nil {
			return err
		}
		defer stopWatch()
	case "stopped":
		if err := st.lc.srv.Stop(ctx); err != nil {
			return err
		}
		stopped = true
	}
	lat, written, el, err := st.quietWindow(ctx, capacity, window, early)
	if err != nil {
		return err
	}
	r.Lat = append(r.Lat, lat)
	r.SrcLat.Achieved = append(r.SrcLat.Achieved, float64(written)/el.Seconds())
	r.SrcLat.WindowS = append(r.SrcLat.WindowS, el.Seconds())
	r.Messages = written
	b.srcCaseNote(ctx, st, sp, cs, r, drainedAt)
	b.log.Info("sources latency", "case", cs, "messages", written, "window", el.Round(time.Millisecond),
		"p50_ms", lat[0], "p99_ms", lat[2], "max_ms", lat[3])
	return nil
}

// startLatProcs starts the relay process of a case and waits until its
// sources run: one process with all four sources, or, in case apart, one
// with the quiet sources and a second relay (--database-url) on the
// loaded source.
func (b *bench) startLatProcs(ctx context.Context, st *srcLat, cs string) ([]*srcProc, error) {
	sets := [][]srcDB{st.dbs}
	switch cs {
	case "apart":
		sets = [][]srcDB{st.dbs[:srcQuiet], st.dbs[srcQuiet:]}
	case "inert":
		sets = [][]srcDB{st.dbs[:srcQuiet]}
	}
	var procs []*srcProc
	for i, dbs := range sets {
		sp, err := b.startSrcProc(ctx, nil, "lat", i == 0, dbs, st.recv.URL)
		if err != nil {
			return procs, err
		}
		procs = append(procs, sp)
	}
	for _, sp := range procs {
		if err := sp.ready(ctx, 30*time.Second); err != nil {
			return procs, err
		}
	}
	return procs, nil
}

// resetLoaded puts the loaded source back as the next case expects it,
// once the relay stopped: its cluster started again (stopped), its
// outbox emptied of what is left of a backlog.
func (b *bench) resetLoaded(ctx context.Context, st *srcLat, cs string, stopped bool) {
	ctx = context.WithoutCancel(ctx)
	if stopped {
		if err := st.lc.srv.Start(ctx); err != nil {
			b.log.Warn("restarting the loaded source's cluster", "error", err)
		}
		st.load.Reset()
	}
	if cs == "backlog" || cs == "apart" || cs == "inert" {
		if _, err := st.load.Exec(ctx, "TRUNCATE "+srcSchema+".messages"); err != nil {
			b.log.Warn("emptying the loaded source", "error", err)
		}
	}
}

// warmUp writes a few messages into every quiet source, and the loaded
// one when loaded (numbered past capacity: not measured), and waits for
// them, then clears the receiver's order and counts.
func (st *srcLat) warmUp(ctx context.Context, capacity int, loaded bool) error {
	st.recv.reset(capacity)
	const each = 10
	n := srcQuiet
	if loaded {
		n++
	}
	for s := range n {
		for i := range each {
			if err := st.write(ctx, s, fmt.Sprintf("warm-%d", s), int64(capacity+s*each+i)); err != nil {
				return err
			}
		}
	}
	if !st.recv.waitCount(ctx, int64(n*each), 15*time.Second) {
		return fmt.Errorf("warm-up: %d of %d messages received", st.recv.count.Load(), n*each)
	}
	st.recv.resetOrder()
	return nil
}

// srcBacklog commits the loaded source's backlog in one statement and
// watches it drain: early is closed, and drainedAt set (unix ns), when
// its outbox is first seen empty.
func (b *bench) srcBacklog(ctx context.Context, st *srcLat) (<-chan struct{}, *atomic.Int64, func(), error) {
	g := fmt.Sprintf("(%d + g)", srcBulkN)
	sql := fmt.Sprintf(`INSERT INTO %s.messages (topic, key, payload) SELECT 'bench', 'bulk-' || (g %% 1000), %s FROM generate_series(1, %d) AS g`,
		srcSchema, payloadSQL(g, b.cfg.payload), srcBacklogN)
	start := time.Now()
	if _, err := st.load.Exec(ctx, sql); err != nil {
		return nil, nil, nil, fmt.Errorf("backlog: %w", err)
	}
	b.log.Info("sources group: backlog committed", "n", srcBacklogN, "took", time.Since(start).Round(time.Millisecond))
	early, stop := make(chan struct{}), make(chan struct{})
	var at atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var empty bool
			if err := st.load.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+srcSchema+".messages)").Scan(&empty); err == nil && empty {
				at.Store(time.Now().UnixNano())
				close(early)
				return
			}
		}
	}()
	return early, &at, func() { close(stop); wg.Wait() }, nil
}

// quietWindow writes into the quiet sources, open loop at srcQuietRate
// each, for window or until early is closed, waits for every message,
// and returns the latency percentiles (p50, p95, p99, max in ms), the
// messages written and the window's length.
func (st *srcLat) quietWindow(ctx context.Context, capacity int, window time.Duration, early <-chan struct{}) ([]float64, int, time.Duration, error) {
	per := int64(capacity / srcQuiet)
	commits := make([]atomic.Int64, capacity)
	start := time.Now()
	deadline := start.Add(window)
	period := time.Duration(float64(time.Second) / srcQuietRate)
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		werr    error
		written atomic.Int64
		endedAt atomic.Int64
	)
	for s := range srcQuiet {
		next := new(atomic.Int64)
		for j := range srcWriters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					i := next.Add(1) - 1
					due := start.Add(time.Duration(i) * period)
					if i >= per || due.After(deadline) {
						return
					}
					select {
					case <-early:
						endedAt.CompareAndSwap(0, time.Now().UnixNano())
						return
					case <-time.After(time.Until(due)):
					}
					n := i*srcQuiet + int64(s)
					if err := st.write(ctx, s, fmt.Sprintf("q%d-%d-%d", s, j, i%25), n); err != nil {
						errOnce.Do(func() { werr = err })
						return
					}
					commits[n].Store(time.Now().UnixNano())
					written.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	el := time.Since(start)
	if e := endedAt.Load(); e > 0 {
		el = time.Unix(0, e).Sub(start)
	}
	if werr != nil {
		return nil, 0, 0, werr
	}
	lat, err := st.latencies(ctx, commits)
	return lat, int(written.Load()), el, err
}

// latencies waits (up to 60 s) until every committed message arrived and
// returns p50, p95, p99 and max, in ms.
func (st *srcLat) latencies(ctx context.Context, commits []atomic.Int64) ([]float64, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var lat []float64
		missing := 0
		for i := range commits {
			c, a := commits[i].Load(), st.recv.arrivals[i].Load()
			switch {
			case c == 0:
			case a == 0:
				missing++
			default:
				lat = append(lat, max(0, float64(a-c)/1e6))
			}
		}
		if missing == 0 && len(lat) > 0 {
			sort.Float64s(lat)
			return []float64{percentile(lat, 50), percentile(lat, 95), percentile(lat, 99), lat[len(lat)-1]}, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("%d of %d messages not received after 60s", missing, missing+len(lat))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// srcCaseNote notes what the loaded source did in the window: how long
// its backlog took, or its state and restarts with its database
// stopped; and the quiet messages' per-key order.
func (b *bench) srcCaseNote(ctx context.Context, st *srcLat, sp *srcProc, cs string, r *row, drainedAt *atomic.Int64) {
	run := len(r.Lat)
	switch cs {
	case "backlog", "apart":
		if at := drainedAt.Load(); at > 0 {
			r.addNote("run %d: the backlog drained within the window (%.1f s)", run, r.SrcLat.WindowS[run-1])
			break
		}
		var left int64
		_ = st.load.QueryRow(ctx, "SELECT count(*) FROM "+srcSchema+".messages").Scan(&left)
		r.addNote("run %d: %d of the backlog left at the window's end", run, left)
	case "stopped":
		r.addNote("run %d: at the window's end the 4th source was %s", run, sp.sourceState(ctx, sp.names[srcQuiet], run == 1))
	}
	if v := st.recv.orderViolations(); v > 0 {
		r.addNote("run %d: %d per-key order violations", run, v)
	}
}

// srcLatRows finishes the latency rows, with each one's p99 over the
// alone row's, and adds them to the report.
func (b *bench) srcLatRows(rows map[string]*row) {
	alone := rows["alone"]
	alone.finish()
	for _, cs := range srcCases {
		r := rows[cs]
		if cs != "alone" {
			r.finish()
			if alone.P99 > 0 {
				r.SrcLat.XAlone = r.P99 / alone.P99
			}
			for i, l := range r.Lat {
				if i < len(alone.Lat) && alone.Lat[i][2] > 0 {
					r.SrcLat.XAloneRuns = append(r.SrcLat.XAloneRuns, l[2]/alone.Lat[i][2])
				}
			}
		}
		r.Rate = median(r.SrcLat.Achieved)
		r.addNote("%s windows; writers: %d pgx connections a source, one message a transaction; quiet sources and the loaded one on two throwaway clusters", orDash(fmtList(r.SrcLat.WindowS, "%.1f s")), srcWriters)
		b.rep.add(r)
	}
}

// fmtList formats each value with format, comma-separated.
func fmtList(v []float64, format string) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf(format, x)
	}
	return s
}

// sourceState describes a source of the process from its admin
// listener: its state and restarts (/metrics), and with ready /readyz's
// answer.
func (sp *srcProc) sourceState(ctx context.Context, source string, ready bool) string {
	states := []string{"starting", "running", "down", "stopped"}
	series := []string{fmt.Sprintf("outbox_relay_source_restarts_total{source=%q}", source)}
	for _, s := range states {
		series = append(series, srcStateSeries(source, s))
	}
	m, err := scrapeMetrics(ctx, sp.admin, series...)
	if err != nil {
		return "unknown: " + shorten(err.Error())
	}
	state := "?"
	for _, s := range states {
		if m[srcStateSeries(source, s)] == 1 {
			state = s
		}
	}
	out := fmt.Sprintf("%s (restarted %.0f times)", state, m[series[0]])
	if !ready {
		return out
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sp.admin+"/readyz", nil)
	if err != nil {
		return out
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 120))
	line := strings.Join(strings.Fields(string(body)), " ")
	line = strings.NewReplacer("|", "/", "`", "'").Replace(line)
	return fmt.Sprintf("%s, /readyz %d `%s…`", out, resp.StatusCode, line)
}
