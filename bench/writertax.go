package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// taxWriters is how many application connections write in the writer-tax
// rows (pgbench's 16 clients in the issue that defined the target).
const taxWriters = 16

// taxCase is one thing the writers insert into, and what else runs.
type taxCase struct {
	name  string
	relay bool   // one relay process drains the outbox while the writers run
	sink  string // its sink: "discard" or "kafka" (kfake)
	extra []string
}

// writerTax measures what the outbox costs the application: 16 writers,
// one single-row INSERT per transaction (autocommit), into a plain table
// with the outbox's four writer columns and no relay, then into the outbox
// while one relay drains it. Runs alternate case by case, so drift in the
// machine hits every case alike; each figure is divided by the plain
// table's median of the same run.
func (b *bench) writerTax(ctx context.Context) error {
	cases := []taxCase{
		{name: "plain table, same four columns, no relay (yardstick)"},
		{name: "outbox, no relay"},
		{name: "outbox, one relay draining → discard", relay: true, sink: "discard"},
		{name: "outbox, one relay draining → Kafka (kfake)", relay: true, sink: "kafka"},
		{name: "outbox, one relay draining → discard, --wakeup notify (writers' trigger)", relay: true, sink: "discard", extra: []string{"--wakeup", "notify"}},
	}
	rows := make([]*row, len(cases))
	for i, c := range cases {
		rows[i] = &row{Group: "writertax", Name: c.name, PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Processes: taxWriters}
		if c.relay {
			rows[i].Batch, rows[i].Workers = b.cfg.batch, b.cfg.workers
		}
	}
	for run := 0; run < b.cfg.runs; run++ {
		for i, c := range cases {
			rate, note, err := b.taxRun(ctx, c)
			if err != nil {
				b.log.Warn("writer-tax run failed", "case", c.name, "error", err)
				rows[i].addNote("run %d failed: %v", run+1, shorten(err.Error()))
				continue
			}
			if note != "" {
				rows[i].addNote("run %d: %s", run+1, note)
			}
			rows[i].addRun(rate, 0)
			b.log.Info("writer tax", "case", c.name, "tx_per_s", int(rate))
		}
	}
	for _, r := range rows {
		r.finish()
	}
	plain := rows[0].Rate
	for i, r := range rows {
		if plain > 0 && r.Rate > 0 {
			r.Ratio = r.Rate / plain
		}
		if i == 0 {
			r.addNote("%d writers, one INSERT per transaction (autocommit), synchronous_commit on, %s per run", taxWriters, b.cfg.taxDur)
		}
		b.rep.add(r)
	}
	return nil
}

// taxRun runs the writers for one case and returns their commits per
// second.
func (b *bench) taxRun(ctx context.Context, c taxCase) (float64, string, error) {
	schema, err := b.newSchema(ctx, "tax")
	if err != nil {
		return 0, "", err
	}
	defer b.dropSchema(ctx, schema)
	s := migrations.Ident(schema)
	table := s + ".messages"
	if c.name == "plain table, same four columns, no relay (yardstick)" {
		table = s + ".plain"
		if _, err := b.pool.Exec(ctx, `CREATE TABLE `+table+` (topic text NOT NULL, key text, payload bytea NOT NULL, headers jsonb NOT NULL DEFAULT '{}')`); err != nil {
			return 0, "", err
		}
	}
	b.checkpoint(ctx)
	note := b.awaitHorizon(ctx)
	if c.relay {
		url := "discard"
		if c.sink == "kafka" {
			var cleanup func()
			url, _, cleanup, err = b.kafkaSetup(ctx, 0)
			if err != nil {
				return 0, "", err
			}
			defer cleanup()
		}
		p, err := b.startRelay(ctx, schema, url, nil, c.extra...)
		if err != nil {
			return 0, "", err
		}
		defer p.stop()
		if err := b.waitLanes(ctx, schema, 1, 15*time.Second); err != nil {
			return 0, "", fmt.Errorf("%w; relay stderr: %s", err, p.stderr)
		}
	}

	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return 0, "", err
	}
	pc.MaxConns, pc.MinConns = taxWriters, taxWriters
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-writer"
	app, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return 0, "", err
	}
	defer app.Close()
	ins := `INSERT INTO ` + table + ` (topic, key, payload) VALUES ('bench', $1, $2)`
	// Warm every connection (and its prepared statement) before the clock.
	var wg sync.WaitGroup
	for w := range taxWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = app.Exec(ctx, ins, fmt.Sprint("key-", w), payloadGo(int64(w), b.cfg.payload))
		}()
	}
	wg.Wait()

	var (
		n       atomic.Int64
		errOnce sync.Once
		werr    error
	)
	start := time.Now()
	deadline := start.Add(b.cfg.taxDur)
	for range taxWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := n.Add(1)
				if _, err := app.Exec(ctx, ins, fmt.Sprintf("key-%d", i%int64(b.cfg.keys)), payloadGo(i, b.cfg.payload)); err != nil {
					errOnce.Do(func() { werr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if werr != nil {
		return 0, note, werr
	}
	return float64(n.Load()) / el.Seconds(), note, nil
}

// taxTable renders the writer-tax rows.
func taxTable(b *strings.Builder, rs []*row) {
	b.WriteString("| writers insert into | writers | runs | median tx/s | × plain table | runs tx/s | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		var runs []string
		for _, v := range r.Rates {
			runs = append(runs, fmt.Sprintf("%.0f", v))
		}
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s |\n", r.Name, r.Processes, r.Runs, fmtRate(r.Rate),
			fmtRatio(r.Ratio), orDash(strings.Join(runs, ", ")), orDash(r.Note))
	}
}
