package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
)

// claimCatcher records the first claim statement the relay sends (the
// one with the LATERAL join over its lanes) with its arguments, so that
// EXPLAIN runs exactly what the relay runs, whatever internal/store/claim.go
// says today.
type claimCatcher struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (c *claimCatcher) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.see(d.SQL, d.Args)
	return ctx
}

func (c *claimCatcher) see(sql string, args []any) {
	if strings.Contains(sql, "LATERAL") {
		c.mu.Lock()
		if c.sql == "" {
			c.sql, c.args = sql, append([]any(nil), args...)
		}
		c.mu.Unlock()
	}
}

// The relay may send its claim in a pipelined batch (BEGIN + claim).
func (c *claimCatcher) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *claimCatcher) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.see(d.SQL, d.Args)
}

func (c *claimCatcher) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *claimCatcher) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// phaseHooks adds up where the relay's workers spend their time.
type phaseHooks struct {
	batches, claimed          atomic.Int64
	claimNs, sendNs, settleNs atomic.Int64
}

func (h *phaseHooks) Batch(ev relay.BatchEvent) {
	h.batches.Add(1)
	h.claimed.Add(int64(ev.Claimed))
	h.claimNs.Add(int64(ev.ClaimDuration))
	h.sendNs.Add(int64(ev.SendDuration))
	h.settleNs.Add(int64(ev.SettleDuration))
}
func (h *phaseHooks) Lanes(int) {}

// profile (BENCH_PROFILE=1) explains the relay's claim query on a loaded
// outbox, then drains it with the relay in this process under a CPU
// profile, with per-phase timings from the relay's hooks. Output goes to
// results/profile-*.
func (b *bench) profile(ctx context.Context) error {
	if err := os.MkdirAll(b.cfg.outDir, 0o755); err != nil {
		return err
	}
	var out strings.Builder
	schema, err := b.newSchema(ctx, "profile")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
		return err
	}

	// Drain in process under the CPU profile.
	sink, err := discard.New(discard.Config{}, nil)
	if err != nil {
		return err
	}
	prof := filepath.Join(b.cfg.outDir, "profile-cpu.pprof")
	f, err := os.Create(prof)
	if err != nil {
		return err
	}
	defer f.Close()
	h := &phaseHooks{}
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	catcher := &claimCatcher{}
	el, err := b.drainInProcess(ctx, schema, sink, h, catcher)
	pprof.StopCPUProfile()
	if err != nil {
		return err
	}
	ms := func(ns int64) string { return time.Duration(ns).Round(time.Millisecond).String() }
	fmt.Fprintf(&out, "# Relay profile: %d messages, %d keys\n\n## In-process drain, discard sink, %d workers, batch %d\n\n", b.cfg.n, b.cfg.keys, b.cfg.workers, b.cfg.batch)
	fmt.Fprintf(&out, "wall %s, %.0f msg/s; %d batches, mean %.0f messages per batch\n\n", el.Round(time.Millisecond),
		float64(b.cfg.n)/el.Seconds(), h.batches.Load(), float64(h.claimed.Load())/float64(max(1, h.batches.Load())))
	fmt.Fprintf(&out, "summed over workers: claim %s, send %s, settle (delete + commit) %s\n\n", ms(h.claimNs.Load()), ms(h.sendNs.Load()), ms(h.settleNs.Load()))
	fmt.Fprintf(&out, "CPU profile: %s (go tool pprof -top %s)\n\n", prof, prof)

	// EXPLAIN the claim the relay sent, on the same backlog loaded again,
	// with every lane owned by the relay id it used; then the raw loop's
	// statement. Both in transactions that are rolled back.
	if catcher.sql == "" {
		return errors.New("the relay sent no claim statement")
	}
	if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
		return err
	}
	owner, _ := catcher.args[0].(string)
	for _, q := range []struct {
		name, sql string
		args      []any
	}{
		{fmt.Sprintf("relay claim as sent by the relay (args %v)", catcher.args), catcher.sql, catcher.args},
		{"claim in id order over all the worker's lanes (experiment)", idOrderClaim(schema), append([]any(nil), catcher.args[:6]...)},
		{"raw-SQL yardstick statement", fmt.Sprintf(`DELETE FROM %[1]s.messages WHERE id IN (SELECT id FROM %[1]s.messages ORDER BY id LIMIT %[2]d FOR UPDATE SKIP LOCKED) RETURNING id, topic, key, payload, headers`, migrations.Ident(schema), b.cfg.batch), nil},
	} {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE "+migrations.Ident(schema)+".lanes SET owner = $1, lease_until = now() + interval '1 hour'", owner); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.sql, q.args...)
			if err != nil {
				return err
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			fmt.Fprintf(&out, "## EXPLAIN (ANALYZE, BUFFERS): %s\n\n```\n%s\n```\n\n", q.name, strings.Join(lines, "\n"))
			return errRollback
		})
		if err != nil && !errors.Is(err, errRollback) {
			return fmt.Errorf("explain %s: %w", q.name, err)
		}
	}
	// Where the gap to raw SQL comes from: the relay's statements alone,
	// then the same claim turned into DELETE … RETURNING.
	fmt.Fprintf(&out, "## The relay's SQL pattern alone (%d connections, no sink), each on a fresh backlog of %d\n\n", b.cfg.workers, b.cfg.n)
	fmt.Fprintf(&out, "| loop | msg/s |\n|---|---|\n")
	fmt.Fprintf(&out, "| relay in process, discard sink (above) | %.0f |\n", float64(b.cfg.n)/el.Seconds())
	type variant struct {
		name string
		del  int
	}
	variants := []variant{{"BEGIN; relay claim as sent (a DELETE … RETURNING); COMMIT", shapeRelay}}
	if !strings.Contains(catcher.sql, "DELETE FROM") {
		variants = []variant{
			{"BEGIN; relay claim (SELECT … FOR UPDATE); DELETE … WHERE id = ANY; COMMIT", shapeRelay},
			{"BEGIN; DELETE … WHERE id IN (relay claim without FOR UPDATE) RETURNING …; COMMIT", shapeDeleteInClaim},
		}
	}
	variants = append(variants, variant{"BEGIN; claim in id order over all the worker's lanes (SELECT … FOR UPDATE); DELETE … WHERE id = ANY; COMMIT", shapeIDOrder})
	for _, v := range variants {
		if _, err := b.pool.Exec(ctx, "TRUNCATE "+migrations.Ident(schema)+".messages"); err != nil {
			return err
		}
		if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
			return err
		}
		rate, err := b.shapeLoop(ctx, schema, catcher.sql, catcher.args, v.del)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		fmt.Fprintf(&out, "| %s | %.0f |\n", v.name, rate)
	}
	fmt.Fprintln(&out)
	fmt.Println(out.String())
	return os.WriteFile(filepath.Join(b.cfg.outDir, "profile.md"), []byte(out.String()), 0o644)
}

var errRollback = errors.New("rollback")

// deleteClaim turns the relay's claim into a DELETE … RETURNING of the
// rows it selects, without its per-row FOR UPDATE (the lane's FOR KEY
// SHARE lock and lease already make the worker the only one on the lane).
func deleteClaim(schema, claim string) string {
	inner := strings.Replace(claim, "    FOR UPDATE\n", "\n", 1)
	return "DELETE FROM " + migrations.Ident(schema) + ".messages WHERE id IN (SELECT c.id FROM (" + inner +
		") c) RETURNING id, message_id, topic, key, payload, headers, created_at, attempts"
}

// Variants of the relay's SQL for shapeLoop.
const (
	shapeRelay = iota
	shapeDeleteInClaim
	shapeIDOrder
)

// idOrderClaim claims the worker's next messages in id order across all
// of its lanes at once, instead of walking one lane's (lane, id) index
// after another: the rows of a batch then sit on a few consecutive heap
// pages instead of one page each. Per-key order is unchanged (a key's
// messages are in one lane, and a lane belongs to one worker).
func idOrderClaim(schema string) string {
	s := migrations.Ident(schema)
	return `
SELECT m.id, m.message_id::text, m.topic, coalesce(m.key, ''), m.payload, m.headers, m.created_at, m.attempts, now()
FROM ` + s + `.messages m
WHERE m.lane IN (
    SELECT l.lane FROM ` + s + `.lanes l
    WHERE l.route = $6 AND l.owner = $1 AND l.lease_until > now() AND l.lane % $2 = $3 AND $4::int IS NOT NULL
    FOR KEY SHARE)
  AND (m.available_at IS NULL OR m.available_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM ` + s + `.messages w
      WHERE w.key = m.key AND w.id < m.id
        AND w.available_at IS NOT NULL AND w.available_at > now())
ORDER BY m.id
LIMIT $5
FOR UPDATE OF m`
}

// shapeLoop drains schema with the relay's SQL pattern and nothing else
// (no sink, no Go-side decoding beyond receiving the rows), in as many
// connections as the relay has workers, each claiming its own lanes the
// way the relay's worker does. deleteInClaim turns the claim into
// DELETE … RETURNING (one write per row instead of a row lock, then a
// delete). It returns messages per second.
func (b *bench) shapeLoop(ctx context.Context, schema string, claim string, args []any, variant int) (float64, error) {
	deleteInClaim := variant == shapeDeleteInClaim || strings.Contains(claim, "DELETE FROM")
	s := migrations.Ident(schema)
	owner, _ := args[0].(string)
	if _, err := b.pool.Exec(ctx, "UPDATE "+s+".lanes SET owner = $1, lease_until = now() + interval '1 hour'", owner); err != nil {
		return 0, err
	}
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: b.cfg.databaseURL, Workers: b.cfg.workers})
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	q := claim
	switch variant {
	case shapeDeleteInClaim:
		q = deleteClaim(schema, claim)
	case shapeIDOrder:
		q = idOrderClaim(schema)
		// $1 owner, $2 workers, $3 worker, $4 unused rotation, $5 batch, $6 route
		args = args[:6:6]
	}
	del := "DELETE FROM " + s + ".messages WHERE id = ANY($1)"
	var total atomic.Int64
	start := time.Now()
	errc := make(chan error, b.cfg.workers)
	var wg sync.WaitGroup
	for w := range b.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := append([]any(nil), args...)
			a[2] = w
			rotation := w
			empty := 0
			for empty < 2 {
				a[3] = rotation
				rotation = (rotation + b.cfg.workers) % 256
				var n int
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					rows, err := tx.Query(ctx, q, a...)
					if err != nil {
						return err
					}
					var ids []int64
					for rows.Next() {
						vals, err := rows.Values()
						if err != nil {
							return err
						}
						ids = append(ids, vals[0].(int64))
					}
					if err := rows.Err(); err != nil {
						return err
					}
					n = len(ids)
					if !deleteInClaim && n > 0 {
						_, err = tx.Exec(ctx, del, ids)
					}
					return err
				})
				if err != nil {
					errc <- err
					return
				}
				total.Add(int64(n))
				if n == 0 {
					empty++
				} else {
					empty = 0
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errc)
	for err := range errc {
		return 0, err
	}
	if left, err := b.countMessages(ctx, schema); err != nil || left != 0 {
		return 0, fmt.Errorf("shape loop left %d rows (%v)", left, err)
	}
	return float64(total.Load()) / el.Seconds(), nil
}
