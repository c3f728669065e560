package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// scaling drains the same backlog with 1..16 relay processes. The
// processes are started on an empty outbox and left to balance the lanes
// between them; the backlog then appears at once, in one committed
// INSERT … SELECT, and the clock runs from that commit until the outbox is
// empty. (Starting the processes on a full outbox would time lane
// rebalancing instead of throughput: the first process up takes all lanes
// and hands them out at its next heartbeat.)
//
// Output goes through the stdout sink to one file per process; per-key
// order is checked on those files at the end.
func (b *bench) scaling(ctx context.Context) error {
	for _, keys := range []int{b.cfg.keys, 1} {
		for _, procs := range b.cfg.procs {
			name := fmt.Sprintf("%d process(es), %d keys", procs, keys)
			if keys == 1 {
				name = fmt.Sprintf("%d process(es), one hot key", procs)
			}
			n := b.cfg.scaleN
			if keys == 1 {
				n = b.cfg.hotN
			}
			r := &row{Group: "scaling", Name: name, Messages: n, PayloadBytes: b.cfg.payload,
				Keys: keys, Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: procs,
				Mode: "binary, stdout sink → files, --heartbeat 1s"}
			for run := 0; run < b.cfg.runs; run++ {
				if err := b.scalingRun(ctx, r, procs, keys, n); err != nil {
					b.log.Warn("scaling run failed", "procs", procs, "keys", keys, "error", err)
					r.addNote("run %d failed: %v", run+1, shorten(err.Error()))
				}
			}
			if keys == 1 {
				r.addNote("one lane: only one worker of one process can work it at a time")
			}
			r.finish()
			b.rep.add(r)
		}
	}
	return nil
}

// scalingLimit is the longest a scaling run may take; a slower run is
// rated on what it delivered by then.
const scalingLimit = 60 * time.Second

func (b *bench) scalingRun(ctx context.Context, r *row, procs, keys, n int) error {
	schema, err := b.newSchema(ctx, "scale")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	dir, err := os.MkdirTemp(b.tmp, "scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	var ps []*relayProc
	var files []string
	defer func() {
		for _, p := range ps {
			p.stop()
		}
	}()
	for i := range procs {
		path := filepath.Join(dir, fmt.Sprintf("relay-%02d.jsonl", i))
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		p, err := b.startRelay(ctx, schema, "stdout", f, "--heartbeat", "1s", "--id", fmt.Sprintf("bench-%02d", i))
		if err != nil {
			return err
		}
		ps = append(ps, p)
		files = append(files, path)
	}
	if err := b.waitLanes(ctx, schema, procs, 60*time.Second); err != nil {
		return fmt.Errorf("%w; stderr of relay 0: %s", err, ps[0].stderr)
	}

	b.checkpoint(ctx)
	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", len(r.Rates)+1, note)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, b.backlogSQL(schema, n, keys)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "ANALYZE "+migrations.Ident(schema)+".messages"); err != nil {
		return err
	}
	start := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	end, delivered, err := b.drained(ctx, r, schema, n)
	if err != nil {
		return err
	}
	el := end.Sub(start)
	for _, p := range ps {
		p.stop()
		if p.Err() != nil {
			return fmt.Errorf("relay exited with %v: %s", p.Err(), p.stderr)
		}
	}
	left, err := b.countMessages(ctx, schema)
	if err != nil {
		return err
	}
	failed, msg, err := checkOrder(files, n-int(left))
	if err != nil {
		return err
	}
	if msg != "" {
		r.addNote("%s", msg)
	}
	if failed {
		r.OrderOK = "FAILED"
	} else if r.OrderOK == "" {
		r.OrderOK = "ok"
	}
	rate := float64(delivered) / el.Seconds()
	r.addRun(rate, 0)
	b.log.Info("scaling", "procs", procs, "keys", keys, "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}

// checkOrder reads the stdout sinks' JSON lines and checks that every
// message arrived exactly once and that each key's messages are in
// increasing seq order within each file, and that when a key appears in
// several files (its lane changed hands) their seq ranges do not overlap.
func checkOrder(files []string, want int) (failed bool, note string, err error) {
	type span struct{ lo, hi int64 }
	type line struct {
		Seq int64   `json:"seq"`
		Key *string `json:"key"`
	}
	seen := make(map[int64]struct{}, want)
	var dups, total, reorders int
	spans := map[string][]span{}
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return false, "", err
		}
		last := map[string]int64{}
		first := map[string]int64{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				f.Close()
				return false, "", fmt.Errorf("%s: %w", path, err)
			}
			total++
			if _, ok := seen[l.Seq]; ok {
				dups++
			}
			seen[l.Seq] = struct{}{}
			if l.Key == nil {
				continue
			}
			k := *l.Key
			if p, ok := last[k]; ok && l.Seq <= p {
				reorders++
			}
			if _, ok := first[k]; !ok {
				first[k] = l.Seq
			}
			last[k] = l.Seq
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return false, "", err
		}
		for k, lo := range first {
			spans[k] = append(spans[k], span{lo, last[k]})
		}
	}
	overlaps := 0
	for _, ss := range spans {
		for i := range ss {
			for j := i + 1; j < len(ss); j++ {
				if ss[i].lo <= ss[j].hi && ss[j].lo <= ss[i].hi {
					overlaps++
				}
			}
		}
	}
	switch {
	case len(seen) != want:
		return true, fmt.Sprintf("%d distinct messages out of %d", len(seen), want), nil
	case reorders > 0 || overlaps > 0:
		return true, fmt.Sprintf("%d out-of-order messages, %d keys worked by two processes at once", reorders, overlaps), nil
	case dups > 0:
		return false, fmt.Sprintf("%d of %d lines were duplicates (at-least-once)", dups, total), nil
	}
	return false, "", nil
}
