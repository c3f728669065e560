package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// together starts 1, 2, 4 and 16 relay processes at the same instant on a
// full outbox (the situation after an outage or a deploy) and times the
// drain from their start until the outbox is empty: lane handover and
// start-up are part of the figure, unlike the scaling group (which starts
// the relays on an empty outbox and waits for balance). Default relay
// settings (lease TTL 15s, heartbeat 5s). Each N is rated against N=1 of
// the same binary in the same run; with BENCH_BASE_BIN, each run also
// runs that binary, alternating with the one under test (A/B pairs).
//
// A sampler reads the lanes table every 10ms for the timeline of lane
// ownership: how long each relay took from the start to hold its fair
// share, and, per run, when the last did. Kafka runs check per-key order
// by consuming kfake's topic.
func (b *bench) together(ctx context.Context) error {
	type bin struct{ label, path string }
	bins := []bin{{"", b.cfg.relayBin}}
	if p := os.Getenv("BENCH_BASE_BIN"); p != "" {
		bins = []bin{{" [base]", p}, {"", b.cfg.relayBin}}
	}
	sinkNames := []string{"discard", "kafka"}
	if v := os.Getenv("BENCH_SINKS"); v != "" {
		sinkNames = strings.Split(v, ",")
	}
	n := b.cfg.scaleN
	rows := map[string]*row{}
	var order []string
	key := func(bl, sink string, procs int) string { return fmt.Sprintf("%s|%s|%d", bl, sink, procs) }
	for _, bl := range bins {
		for _, sink := range sinkNames {
			for _, procs := range b.cfg.procs {
				k := key(bl.label, sink, procs)
				rows[k] = &row{Group: "together", Name: fmt.Sprintf("%d relay(s) started together on the backlog → %s%s", procs, sink, bl.label),
					Messages: n, PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers,
					Processes: procs, Mode: "binary, default lease settings, clock from the processes' start"}
				order = append(order, k)
			}
		}
	}
	for run := 0; run < b.cfg.runs; run++ {
		for _, sink := range sinkNames {
			for _, procs := range b.cfg.procs {
				for _, bl := range bins {
					r := rows[key(bl.label, sink, procs)]
					if err := b.togetherRun(ctx, r, bl.path, sink, procs, n); err != nil {
						b.log.Warn("together run failed", "procs", procs, "sink", sink, "bin", bl.path, "error", err)
						r.addNote("run %d failed: %v", run+1, shorten(err.Error()))
					}
				}
			}
		}
	}
	for _, k := range order {
		r := rows[k]
		r.finish()
		bl, sink, _ := strings.Cut(k, "|")
		sink, _, _ = strings.Cut(sink, "|")
		if one := rows[key(bl, sink, 1)]; one != nil && one != r && one.Rate > 0 && r.Rate > 0 {
			r.addNote("%.2f× one relay (same binary, same run)", r.Rate/one.Rate)
		}
		b.rep.add(r)
	}
	return nil
}

func (b *bench) togetherRun(ctx context.Context, r *row, bin, sink string, procs, n int) error {
	schema, err := b.newSchema(ctx, "together")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	if err := b.loadBacklog(ctx, schema, n, b.cfg.keys); err != nil {
		return err
	}
	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", len(r.Rates)+1, note)
	}
	sinkURL, addr := "discard", ""
	if sink == "kafka" {
		url, _, closeFn, err := b.kafkaSetup(ctx, 0)
		if err != nil {
			return err
		}
		defer closeFn()
		sinkURL, addr = url, strings.TrimPrefix(url, "kafka://")
	}

	sctx, stopSampler := context.WithCancel(ctx)
	// The clock starts here: the samplers and the processes start now.
	tl := &laneTimeline{start: time.Now()}
	start := tl.start
	samplerDone := spawnBench(func() { b.sampleLanes(sctx, schema, tl) })
	defer func() { stopSampler(); <-samplerDone }()
	if os.Getenv("BENCH_PROGRESS") == "1" {
		var prog []string
		progDone := spawnBench(func() { b.sampleProgress(sctx, schema, start, &prog) })
		defer func() {
			stopSampler()
			<-progDone
			fmt.Fprintf(os.Stderr, "together: deleted rows, %d relays → %s: %s\n", procs, sink, strings.Join(prog, " "))
		}()
	}
	if os.Getenv("BENCH_WAITS") == "1" {
		waits := map[string]int{}
		waitsDone := spawnBench(func() { b.sampleWaits(sctx, waits) })
		defer func() {
			stopSampler()
			<-waitsDone
			fmt.Fprintf(os.Stderr, "together: wait events, %d relays → %s:%s\n", procs, sink, topWaits(waits, 14))
		}()
	}

	saved := b.cfg.relayBin
	b.cfg.relayBin = bin
	defer func() { b.cfg.relayBin = saved }()
	var ps []*relayProc
	defer func() {
		for _, p := range ps {
			p.stop()
		}
	}()
	for i := range procs {
		p, err := b.startRelay(ctx, schema, sinkURL, nil, "--id", fmt.Sprintf("bench-%02d", i))
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	end, delivered, err := b.drained(ctx, r, schema, n)
	if err != nil {
		return err
	}
	el := end.Sub(start)
	stopSampler()
	<-samplerDone
	for _, p := range ps {
		p.stop()
		if p.Err() != nil {
			return fmt.Errorf("relay exited with %v: %s", p.Err(), p.stderr)
		}
	}
	rate := float64(delivered) / el.Seconds()
	r.addRun(rate, 0)
	fair := tl.fairShareTimes(procs)
	b.log.Info("together", "procs", procs, "sink", sink, "bin", bin, "rate", int(rate), "took", el.Round(time.Millisecond),
		"all_at_fair_share_after", fair.Round(time.Millisecond), "timeline", tl.summary())
	if procs > 1 {
		if fair > 0 {
			r.addNote("run %d: every relay at its fair share %s after the start", len(r.Rates), fair.Round(time.Millisecond))
		} else {
			r.addNote("run %d: lanes never balanced before the outbox was empty", len(r.Rates))
		}
	}
	if sink == "kafka" {
		msg, failed, err := checkKafkaOrder(ctx, addr, delivered)
		if err != nil {
			return err
		}
		if msg != "" {
			r.addNote("run %d: %s", len(r.Rates), msg)
		}
		if failed {
			r.OrderOK = "FAILED"
		} else if r.OrderOK == "" {
			r.OrderOK = "ok"
		}
	}
	return nil
}

func spawnBench(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	return done
}

// laneTimeline is the lanes table sampled every 10ms: when each sample
// was taken and how many live lanes each relay held.
type laneTimeline struct {
	mu      sync.Mutex
	start   time.Time
	samples []laneSample
}

type laneSample struct {
	at     time.Duration // since start
	owners map[string]int
}

func (b *bench) sampleLanes(ctx context.Context, schema string, tl *laneTimeline) {
	q := `SELECT owner, count(*) FROM ` + migrations.Ident(schema) + `.lanes
WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner`
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last map[string]int
	for {
		rows, err := b.pool.Query(ctx, q)
		if err == nil {
			owners := map[string]int{}
			for rows.Next() {
				var o string
				var c int
				if rows.Scan(&o, &c) == nil {
					owners[o] = c
				}
			}
			rows.Close()
			if rows.Err() == nil && !mapsEqual(owners, last) {
				tl.mu.Lock()
				tl.samples = append(tl.samples, laneSample{at: time.Since(tl.start), owners: owners})
				tl.mu.Unlock()
				last = owners
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// fairShareTimes returns when every one of procs relays first held its
// fair share (256/procs, ±1) at once, and all 256 lanes were held; 0 if
// never.
func (tl *laneTimeline) fairShareTimes(procs int) time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, s := range tl.samples {
		if balanced(s.owners, procs) {
			return s.at
		}
	}
	return 0
}

func balanced(owners map[string]int, procs int) bool {
	if len(owners) != procs {
		return false
	}
	total := 0
	for _, c := range owners {
		if c < 256/procs || c > (256+procs-1)/procs {
			return false
		}
		total += c
	}
	return total == 256
}

// summary is the timeline as "t=…ms owners…" steps (the first 12).
func (tl *laneTimeline) summary() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var sb strings.Builder
	for i, s := range tl.samples {
		if i == 12 {
			fmt.Fprintf(&sb, " … (%d more)", len(tl.samples)-12)
			break
		}
		ids := make([]string, 0, len(s.owners))
		for o := range s.owners {
			ids = append(ids, o)
		}
		slices.Sort(ids)
		counts := make([]string, len(ids))
		for j, o := range ids {
			counts[j] = fmt.Sprintf("%s:%d", strings.TrimPrefix(o, "bench-"), s.owners[o])
		}
		fmt.Fprintf(&sb, " [%dms %s]", s.at.Milliseconds(), strings.Join(counts, ","))
	}
	return strings.TrimSpace(sb.String())
}

// checkKafkaOrder consumes the bench topic of the kfake cluster at addr
// and checks that want distinct messages arrived and that each key's
// messages are in write order (the payload's n), duplicates allowed.
func checkKafkaOrder(ctx context.Context, addr string, want int) (note string, failed bool, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("bench"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return "", false, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := map[string]int64{}
	seen := make(map[int64]struct{}, want)
	var reorders, dups int
	for len(seen) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Sprintf("consumed %d distinct of %d", len(seen), want), true, nil
		}
		fs.EachRecord(func(rec *kgo.Record) {
			var p struct {
				N int64 `json:"n"`
			}
			if json.Unmarshal(rec.Value, &p) != nil {
				return
			}
			if _, ok := seen[p.N]; ok {
				dups++
				return
			}
			seen[p.N] = struct{}{}
			k := string(rec.Key)
			if l, ok := last[k]; ok && p.N < l {
				reorders++
			}
			last[k] = p.N
		})
	}
	switch {
	case reorders > 0:
		return fmt.Sprintf("%d out-of-order messages", reorders), true, nil
	case dups > 0:
		return fmt.Sprintf("%d duplicates (at-least-once)", dups), false, nil
	}
	return "", false, nil
}

// sampleWaits counts, every 20ms, what the database's active sessions
// (other than this one) are doing: wait event and the statement's start.
func (b *bench) sampleWaits(ctx context.Context, waits map[string]int) {
	q := `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), left(regexp_replace(query, '\s+', ' ', 'g'), 50)
FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND datname = current_database()`
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		rows, err := b.pool.Query(ctx, q)
		if err == nil {
			for rows.Next() {
				var w, qs string
				if rows.Scan(&w, &qs) == nil {
					waits[w+" | "+qs]++
				}
			}
			rows.Close()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func topWaits(m map[string]int, n int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.v - a.v })
	var sb strings.Builder
	for i, e := range all {
		if i == n {
			break
		}
		fmt.Fprintf(&sb, "\n  %5d  %s", e.v, e.k)
	}
	return sb.String()
}

// sampleProgress records, every 500ms, how many rows of the schema's
// outbox have been deleted (the statistics counters: flushed by the
// relays' sessions about once a second, so a coarse timeline).
func (b *bench) sampleProgress(ctx context.Context, schema string, start time.Time, out *[]string) {
	q := `SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'messages'`
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var n int64
		if b.pool.QueryRow(ctx, q, schema).Scan(&n) == nil {
			*out = append(*out, fmt.Sprintf("%.1fs:%dk", time.Since(start).Seconds(), n/1000))
		}
	}
}

// rebalance measures, with 16 relays on a backlog (discard sink), how
// long a relay that starts next to 15 balanced ones takes to hold its
// fair share (16 lanes), from its process start and from its
// registration (database clock), and how long the other 15 take to hold
// every lane of a relay sent SIGTERM. Reported, not asserted.
func (b *bench) rebalance(ctx context.Context) error {
	const procs = 16
	r := &row{Group: "together", Name: "rebalance with 16 relays (ms): join → fair share; SIGTERM → lanes taken",
		Messages: b.cfg.scaleN, PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers,
		Processes: procs, Mode: "binary, default lease settings, lanes sampled every 5ms"}
	var joins, joinsReg, leaves []float64
	for run := 0; run < b.cfg.runs; run++ {
		j, jr, l, err := b.rebalanceRun(ctx, procs)
		if err != nil {
			b.log.Warn("rebalance run failed", "error", err)
			r.addNote("run %d failed: %v", run+1, shorten(err.Error()))
			continue
		}
		joins, joinsReg, leaves = append(joins, j), append(joinsReg, jr), append(leaves, l)
		b.log.Info("rebalance", "join_from_process_start_ms", j, "join_from_registration_ms", jr, "sigterm_to_taken_ms", l)
	}
	if len(joins) > 0 {
		r.addNote("join → fair share: median %.0f ms from process start, %.0f ms from registration (max %.0f); SIGTERM → all its lanes held by the others: median %.0f ms (max %.0f); runs: %v / %v / %v",
			median(joins), median(joinsReg), slices.Max(joinsReg), median(leaves), slices.Max(leaves), joins, joinsReg, leaves)
	}
	b.rep.add(r)
	return nil
}

func (b *bench) rebalanceRun(ctx context.Context, procs int) (join, joinReg, leave float64, err error) {
	schema, err := b.newSchema(ctx, "rebal")
	if err != nil {
		return 0, 0, 0, err
	}
	defer b.dropSchema(ctx, schema)
	if err := b.loadBacklog(ctx, schema, b.cfg.scaleN, b.cfg.keys); err != nil {
		return 0, 0, 0, err
	}
	var ps []*relayProc
	defer func() {
		for _, p := range ps {
			p.stop()
		}
	}()
	for i := range procs - 1 {
		p, err := b.startRelay(ctx, schema, "discard", nil, "--id", fmt.Sprintf("bench-%02d", i))
		if err != nil {
			return 0, 0, 0, err
		}
		ps = append(ps, p)
	}
	if err := b.waitLanes(ctx, schema, procs-1, 60*time.Second); err != nil {
		return 0, 0, 0, err
	}
	s := migrations.Ident(schema)
	owned := func(id string) (n int, reg time.Duration, err error) {
		var regMs float64
		err = b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.lanes WHERE owner = $1 AND lease_until > now()),
       coalesce((SELECT extract(epoch FROM clock_timestamp() - started_at) * 1000 FROM `+s+`.relays WHERE id = $1), -1)`, id).Scan(&n, &regMs)
		return n, time.Duration(regMs * float64(time.Millisecond)), err
	}
	// Join.
	id := fmt.Sprintf("bench-%02d", procs-1)
	start := time.Now()
	p, err := b.startRelay(ctx, schema, "discard", nil, "--id", id)
	if err != nil {
		return 0, 0, 0, err
	}
	ps = append(ps, p)
	for {
		n, reg, err := owned(id)
		if err != nil {
			return 0, 0, 0, err
		}
		if n >= 256/procs {
			join, joinReg = float64(time.Since(start).Milliseconds()), float64(reg.Milliseconds())
			break
		}
		if time.Since(start) > 30*time.Second {
			return 0, 0, 0, fmt.Errorf("joining relay holds %d lanes after 30s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Leave: SIGTERM the first relay; its lanes must be held by live
	// others (a lane of a relay no longer registered does not count).
	if err := b.waitLanes(ctx, schema, procs, 60*time.Second); err != nil {
		return 0, 0, 0, err
	}
	var mine []int16
	rows, err := b.pool.Query(ctx, `SELECT lane FROM `+s+`.lanes WHERE owner = 'bench-00'`)
	if err != nil {
		return 0, 0, 0, err
	}
	for rows.Next() {
		var l int16
		if err := rows.Scan(&l); err != nil {
			rows.Close()
			return 0, 0, 0, err
		}
		mine = append(mine, l)
	}
	rows.Close()
	start = time.Now()
	_ = ps[0].Signal(syscall.SIGTERM)
	for {
		var left int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.lanes l WHERE l.lane = ANY($1) AND NOT (
    l.owner IS NOT NULL AND l.owner <> 'bench-00' AND l.lease_until > now()
    AND EXISTS (SELECT 1 FROM `+s+`.relays r WHERE r.id = l.owner))`, mine).Scan(&left); err != nil {
			return 0, 0, 0, err
		}
		if left == 0 {
			leave = float64(time.Since(start).Milliseconds())
			break
		}
		if time.Since(start) > 30*time.Second {
			return 0, 0, 0, fmt.Errorf("%d lanes of the stopped relay not taken after 30s", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return join, joinReg, leave, nil
}
