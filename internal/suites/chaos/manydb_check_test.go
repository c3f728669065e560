package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// blockResult is what the block of one database (the long form) showed.
type blockResult struct {
	db         string
	terminated int64 // relay sessions ended at the start of the block
	later      int64 // relay sessions found (and ended) later in the block: none expected
	backlog    int64 // messages waiting in its outbox when it reopened
	stalled    int   // its deliveries during the block: batches in flight at its start
	fewest     int   // the fewest deliveries of another source during the block
	fewestDB   string
	// caughtUp is the time from the reopening until that backlog was
	// delivered; -1 when it was not within catchUpWait (the drain then
	// says whether it ever was).
	caughtUp time.Duration
	readyz   string // a relay's /readyz line about the blocked source
	err      error  // the block could not be set up or lifted
}

// relayApp is the application_name of the relays' sessions: the default,
// as the sources' URLs name none.
const relayApp = "outbox-relay"

// blockSource makes database dbs[i] refuse connections for the plan's
// block: ALLOW_CONNECTIONS false, and every relay session on it
// terminated (again each second, should one have got in). The writers
// keep the sessions they hold, so messages pile up in that outbox. Then
// it lets connections in again and waits until the relays delivered what
// had piled up.
func (f *fleet) blockSource(ctx context.Context, i int) blockResult {
	db := f.dbs[i]
	r := blockResult{db: db}
	// The test's own look into the blocked outbox, opened before the block.
	look, err := pgx.Connect(ctx, f.dbURL(db)+"&application_name=chaos-look")
	if err != nil {
		r.err = fmt.Errorf("connect to %s: %w", db, err)
		return r
	}
	defer look.Close(context.WithoutCancel(ctx))
	before := f.deliveredBySource()
	if _, err := f.admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false"); err != nil {
		r.err = fmt.Errorf("block %s: %w", db, err)
		return r
	}
	end := time.Now().Add(f.p.block)
	for first := true; time.Now().Before(end) && ctx.Err() == nil; first = false {
		n, err := f.terminateOn(ctx, db)
		if err != nil {
			r.err = fmt.Errorf("terminate the relays' sessions on %s: %w", db, err)
		}
		if first {
			r.terminated = n
			f.note("database %s refuses connections for %s; %d relay sessions on it terminated", db, f.p.block, n)
		} else {
			r.later += n
		}
		sleepCtx(ctx, min(time.Second, time.Until(end)))
	}
	after := f.deliveredBySource()
	r.stalled, r.fewest = after[db]-before[db], -1
	for _, o := range f.dbs {
		if d := after[o] - before[o]; o != db && (r.fewest < 0 || d < r.fewest) {
			r.fewest, r.fewestDB = d, o
		}
	}
	r.readyz = f.readyzNaming(ctx, db)
	var lastID int64
	if err := look.QueryRow(ctx, `SELECT count(*), coalesce(max(id), 0) FROM `+manySchema+`.messages`).Scan(&r.backlog, &lastID); err != nil {
		r.err = fmt.Errorf("backlog of %s: %w", db, err)
	}
	if _, err := f.admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true"); err != nil {
		r.err = fmt.Errorf("unblock %s: %w", db, err)
		return r
	}
	reopened := time.Now()
	f.note("database %s accepts connections again: %d messages waiting; the other sources delivered at least %d each meanwhile (%s); %s",
		db, r.backlog, r.fewest, r.fewestDB, f.backlogs(ctx))
	wait, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	if !testkit.Poll(wait, 250*time.Millisecond, func() bool {
		var left bool
		err := look.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+manySchema+`.messages WHERE id <= $1)`, lastID).Scan(&left)
		return err == nil && !left
	}) {
		r.caughtUp = -1
		f.note("%s has not delivered its backlog %s after accepting connections again; %s", db, catchUpWait, f.backlogs(ctx))
		return r
	}
	r.caughtUp = time.Since(reopened)
	f.note("%s delivered its backlog %s after accepting connections again", db, r.caughtUp.Round(time.Millisecond))
	return r
}

// catchUpWait bounds the wait for the blocked source's backlog. On a
// machine so loaded that every source lags, the backlog waits behind the
// others' in the shared sink: the drain at the end then tells whether
// it was delivered at all.
const catchUpWait = 3 * time.Minute

var adminAddrRe = regexp.MustCompile(`msg="admin listener" addr=(\S+)`)

// readyzNaming asks the running relays' /readyz until one names source
// db, and returns that relay's line about it ("" when none did within
// 15 s): a relay reports a source whose database it cannot reach.
func (f *fleet) readyzNaming(ctx context.Context, db string) string {
	var got string
	wait, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	testkit.Poll(wait, 250*time.Millisecond, func() bool {
		for _, s := range f.c.slots() {
			p := f.c.proc(s)
			var addr string
			for _, l := range grepFile(p.logPath, `msg="admin listener"`) {
				if m := adminAddrRe.FindStringSubmatch(l); m != nil {
					addr = m[1]
				}
			}
			if addr == "" {
				continue
			}
			code, body, err := httpGet(wait, "http://"+addr+"/readyz")
			if err != nil {
				continue
			}
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "source "+db+":") {
					got = fmt.Sprintf("%s /readyz %d: %s", p.id, code, l)
					return true
				}
			}
		}
		return false
	})
	return got
}

// httpGet returns the status and body of a GET of u.
func httpGet(ctx context.Context, u string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// backlogs says how many messages wait in the outboxes: in all, and in
// the fullest one.
func (f *fleet) backlogs(ctx context.Context) string {
	var total, most int64
	fullest := ""
	for i, db := range f.dbs {
		pending, _, err := outboxCounts(ctx, f.wls[i].pool, manySchema)
		if err != nil {
			return fmt.Sprintf("backlog of %s: %v", db, err)
		}
		total += pending
		if pending > most {
			most, fullest = pending, db
		}
	}
	return fmt.Sprintf("%d messages wait in all outboxes, %d in the fullest (%s)", total, most, fullest)
}

// terminateOn ends every relay session on database db.
func (f *fleet) terminateOn(ctx context.Context, db string) (int64, error) {
	var n int64
	err := f.admin.QueryRow(ctx, `
SELECT count(*) FROM (
    SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
    WHERE datname = $1 AND application_name = $2
) t WHERE ok`, db, relayApp).Scan(&n)
	return n, err
}

// idleCost is what the sources cost once idle: the relays' database
// sessions and their processes' CPU.
type idleCost struct {
	sessions [2]int    // relay sessions on the server, at the start and the end of the window
	cores    []float64 // each relay process's CPU over the window, in cores
	window   time.Duration
	err      error
}

// measureIdle measures the relays with every source idle (the writers
// stopped, every outbox empty): their sessions on the server, and their
// CPU over the plan's idle window.
func (f *fleet) measureIdle(ctx context.Context) idleCost {
	var c idleCost
	slots := f.c.slots()
	slices.Sort(slots)
	var procs []*proc
	var cpu0 []time.Duration
	var err error
	c.sessions[0], err = f.relaySessions(ctx)
	for _, s := range slots {
		p := f.c.proc(s)
		d, e := p.CPUTime()
		procs, cpu0, err = append(procs, p), append(cpu0, d), cmpErr(err, e)
	}
	began := time.Now()
	sleepCtx(ctx, f.p.idleFor) // the measurement's window
	for i, p := range procs {
		d, e := p.CPUTime()
		c.window = time.Since(began)
		err = cmpErr(err, e)
		c.cores = append(c.cores, (d-cpu0[i]).Seconds()/c.window.Seconds())
	}
	var e error
	c.sessions[1], e = f.relaySessions(ctx)
	c.err = cmpErr(err, e)
	return c
}

// cmpErr returns the first of a and b that is not nil.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// relaySessions counts the relays' sessions on the server.
func (f *fleet) relaySessions(ctx context.Context) (int, error) {
	var n int
	err := f.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, relayApp).Scan(&n)
	return n, err
}

// sourceVerdict is the contract's checks over every source.
type sourceVerdict struct {
	verdict
	rolledBack int
	violations []string
}

// verifySources checks the receiver's log source by source (keys, seqs
// and tags are a source's own) with verify, and across sources: a
// message id names one message of one source, and each source's
// messages carry its producer, the server's system identifier, the
// source's database and the schema.
func (f *fleet) verifySources(ctx context.Context, log []delivery) sourceVerdict {
	var sv sourceVerdict
	var sysID string
	if err := f.admin.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysID); err != nil {
		f.t.Fatalf("system identifier: %v", err)
	}
	bySource := map[string][]delivery{}
	sourceOf := map[string]string{} // webhook-id -> source
	badProducer := map[string]string{}
	for _, d := range log {
		bySource[d.Source] = append(bySource[d.Source], d)
		if s, ok := sourceOf[d.id]; ok && s != d.Source {
			sv.violations = append(sv.violations, fmt.Sprintf("message id reused across sources: webhook-id %s delivered for %s and %s", d.id, s, d.Source))
		}
		sourceOf[d.id] = d.Source
		if want := sysID + "/" + d.Source + "/" + manySchema; d.producer != want {
			badProducer[d.Source] = fmt.Sprintf("outbox-producer %q, want %q", d.producer, want)
		}
	}
	for _, db := range f.dbs {
		if p, ok := badProducer[db]; ok {
			sv.violations = append(sv.violations, fmt.Sprintf("source %s: %s", db, p))
		}
	}
	for s, ds := range bySource {
		if !slices.Contains(f.dbs, s) {
			sv.violations = append(sv.violations, fmt.Sprintf("%d deliveries name no source of the test (%q)", len(ds), s))
		}
	}
	for i, db := range f.dbs {
		wl := f.wls[i]
		v := verify(wl.committedMessages(ctx, f.t), wl.rolledBackTags(), bySource[db])
		sv.committed += v.committed
		sv.deliveries += v.deliveries
		sv.unique += v.unique
		sv.duplicates += v.duplicates
		sv.rolledBack += len(wl.rolledBackTags())
		for _, x := range v.violations {
			sv.violations = append(sv.violations, "source "+db+": "+x)
		}
	}
	return sv
}

// report checks the run and logs its figures.
func (f *fleet) report(ctx context.Context, drained, stopTook time.Duration, idle idleCost) {
	t := f.t
	log, bad := f.rc.snapshot()
	sv := f.verifySources(ctx, log)
	kills, _, started := f.c.counts()
	f.mu.Lock()
	t.Logf("events:\n%s", strings.Join(f.events, "\n"))
	f.mu.Unlock()
	var txFailed, txAmbiguous int64
	for _, wl := range f.wls {
		txFailed += wl.txFailed.Load()
		txAmbiguous += wl.txAmbiguous.Load()
	}
	t.Logf("writes: %d databases, %d messages committed, %d rolled back on purpose, %d tx failed, %d commits ambiguous; writes took %s",
		len(f.dbs), sv.committed, sv.rolledBack, txFailed, txAmbiguous, f.wrote.Round(time.Millisecond))
	t.Logf("chaos: %s, %d SIGKILLs, %d relay processes started", f.chaosT.Round(time.Millisecond), kills, started)
	t.Logf("delivery: %d requests accepted, %d distinct messages, %d duplicates (%.2f%%); drained %s after the chaos; slowest relay exit after SIGTERM %s",
		sv.deliveries, sv.unique, sv.duplicates, sv.dupPercent(), drained.Round(time.Millisecond), stopTook.Round(time.Millisecond))
	f.reportIdle(idle)
	f.reportBlock()
	if kills < f.p.minKills {
		t.Errorf("%d SIGKILLs, want at least %d", kills, f.p.minKills)
	}
	if sv.committed < f.p.messages {
		t.Errorf("only %d messages committed, want at least %d", sv.committed, f.p.messages)
	}
	if sv.rolledBack == 0 {
		t.Errorf("no transaction rolled back")
	}
	for _, b := range bad {
		t.Errorf("malformed request at the receiver: %s", b)
	}
	for _, x := range f.c.unexpectedExits() {
		t.Errorf("relay process: %s", x)
	}
	for _, x := range f.unexpectedErrors() {
		t.Errorf("relay logged an error: %s", x)
	}
	f.checkEmpty(ctx)
	for i, x := range sv.violations {
		if i == 40 {
			t.Errorf("… and %d more violations", len(sv.violations)-i)
			break
		}
		t.Error(x)
	}
}

// reportIdle logs what an idle source costs.
func (f *fleet) reportIdle(c idleCost) {
	t := f.t
	if c.err != nil {
		t.Errorf("idle measurement: %v", c.err)
		return
	}
	n := float64(len(f.dbs))
	var total float64
	for _, x := range c.cores {
		total += x
	}
	procs := float64(max(1, len(c.cores)))
	t.Logf("idle: %d relay processes hold %d database sessions (%d at the end of the window): %.2f an idle source, %.2f per process",
		len(c.cores), c.sessions[0], c.sessions[1], float64(c.sessions[0])/n, float64(c.sessions[0])/n/procs)
	t.Logf("idle: their CPU over %s with every source idle: %.4f cores in all (by process: %s), %.5f core an idle source (%.5f per process)",
		c.window.Round(time.Millisecond), total, fmtCores(c.cores), total/n, total/n/procs)
}

// fmtCores lists CPU figures, in cores.
func fmtCores(cores []float64) string {
	parts := make([]string, len(cores))
	for i, c := range cores {
		parts[i] = fmt.Sprintf("%.4f", c)
	}
	return strings.Join(parts, ", ")
}

// reportBlock checks and logs the long form's blocked database.
func (f *fleet) reportBlock() {
	f.mu.Lock()
	r := f.block
	f.mu.Unlock()
	if f.p.block == 0 {
		return
	}
	t := f.t
	if r == nil {
		t.Errorf("the database block did not run")
		return
	}
	caught := r.caughtUp.Round(time.Millisecond).String()
	if r.caughtUp < 0 {
		caught = "not within " + catchUpWait.String() + " (in the final drain)"
	}
	t.Logf("block: %s refused connections for %s (%d relay sessions terminated, %d more later); %d of its deliveries during the block; "+
		"every other source delivered at least %d meanwhile (%s the fewest); %d messages waited, delivered %s after it accepted connections again",
		r.db, f.p.block, r.terminated, r.later, r.stalled, r.fewest, r.fewestDB, r.backlog, caught)
	if r.err != nil {
		t.Errorf("block: %v", r.err)
	}
	if r.terminated == 0 {
		t.Errorf("block: no relay session on %s to terminate", r.db)
	}
	if r.fewest <= 0 {
		t.Errorf("block: source %s delivered nothing while %s was blocked", r.fewestDB, r.db)
	}
	if r.backlog == 0 {
		t.Errorf("block: nothing waited in %s when it accepted connections again: the block held nothing back", r.db)
	}
	if r.readyz == "" {
		t.Errorf("block: no relay's /readyz named source %s while its database refused connections", r.db)
	} else {
		t.Logf("block: while %s refused connections, %s", r.db, r.readyz)
	}
}

// unexpectedErrors returns the relays' ERROR lines (at most 20) but
// those that report the blocked source down (the long form): the relay
// logs ERROR when it sees the contract broken by a sink, and when a
// source is down.
func (f *fleet) unexpectedErrors() []string {
	f.mu.Lock()
	blocked := ""
	if f.block != nil {
		blocked = "source=" + f.block.db + " "
	}
	f.mu.Unlock()
	f.c.mu.Lock()
	all := slices.Clone(f.c.all)
	f.c.mu.Unlock()
	var out []string
	n := 0
	for _, p := range all {
		for _, l := range grepFile(p.logPath, "level=ERROR") {
			if blocked != "" && strings.Contains(l, `msg="source down; its relays start again later"`) && strings.Contains(l, blocked) {
				continue
			}
			if n++; n <= 20 {
				out = append(out, p.id+": "+l)
			}
		}
	}
	if n > 20 {
		out = append(out, fmt.Sprintf("… and %d more", n-20))
	}
	return out
}

// checkEmpty requires every outbox and dead-letter table to be empty.
func (f *fleet) checkEmpty(ctx context.Context) {
	for i, db := range f.dbs {
		pending, dead, err := outboxCounts(ctx, f.wls[i].pool, manySchema)
		if err != nil {
			f.t.Errorf("source %s: outbox counts: %v", db, err)
		} else if pending != 0 || dead != 0 {
			f.t.Errorf("source %s: after the drain, %d messages left in the outbox, %d dead letters; want 0 and 0", db, pending, dead)
		}
	}
}
