package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
)

// claimStatement is the claim internal/store renders for the relay:
// worker 0 of workers, lanes leased to owner, from rotation 0.
func claimStatement(schema, owner string, workers, limit int) (string, []any, error) {
	sc, err := store.NewSchema(schema)
	if err != nil {
		return "", nil, err
	}
	var prio bool
	cb := &pgx.Batch{}
	store.NewEngine(sc, store.Outbox, "", false).QueueClaim(cb, store.ClaimParams{Relay: owner, Workers: workers, Limit: limit,
		MaxBytes: 16 << 20}, &prio, func(store.ClaimedRow) error { return nil })
	q := cb.QueuedQueries[len(cb.QueuedQueries)-1]
	return q.SQL, q.Arguments, nil
}

// stmtTimer adds up, per kind of statement, the time between the results
// of the relay's pipelined batches: from the batch's start (or the
// previous statement's result) to the moment pgx finished a statement's
// result (for the claim, after its rows were read and decoded). The
// server flushes its results at the pipeline's Sync, so the first
// statement of a batch (BEGIN) carries the server's time for the whole
// batch, and the claim's own line is the time to read its rows.
type stmtTimer struct {
	mu    sync.Mutex
	last  map[*pgx.Conn]time.Time
	total map[string]time.Duration
	count map[string]int
}

func newStmtTimer() *stmtTimer {
	return &stmtTimer{last: map[*pgx.Conn]time.Time{}, total: map[string]time.Duration{}, count: map[string]int{}}
}

func (s *stmtTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (s *stmtTimer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *stmtTimer) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	s.last[c] = time.Now()
	s.mu.Unlock()
	return ctx
}

func (s *stmtTimer) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	now := time.Now()
	kind := "other"
	switch q := strings.TrimSpace(d.SQL); {
	case q == "BEGIN":
		// The server sends its results when the pipeline's Sync is
		// reached: the first result carries the wait for all of them.
		kind = "BEGIN: sending the batch and the server running all of it"
	case q == "COMMIT":
		kind = "COMMIT"
	case strings.Contains(q, "set_config"):
		kind = "NoSeqScan settings"
	case strings.Contains(q, "LATERAL"):
		kind = "claim: reading and decoding its rows"
	case strings.Contains(q, "priority > 0"):
		kind = "priority probe"
	case strings.HasPrefix(q, "DELETE"):
		kind = "delete delivered"
	}
	s.mu.Lock()
	s.total[kind] += now.Sub(s.last[c])
	s.count[kind]++
	s.last[c] = now
	s.mu.Unlock()
}

func (s *stmtTimer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// report writes the sums as a markdown table.
func (s *stmtTimer) report(out *strings.Builder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.total))
	for k := range s.total {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	fmt.Fprintf(out, "| statement, in pipelined batches | count | summed over workers | mean |\n|---|---|---|---|\n")
	for _, k := range kinds {
		fmt.Fprintf(out, "| %s | %d | %s | %s |\n", k, s.count[k], s.total[k].Round(time.Millisecond), (s.total[k] / time.Duration(max(1, s.count[k]))).Round(time.Microsecond))
	}
	fmt.Fprintln(out)
}

// phaseHooks adds up where the relay's workers spend their time.
type phaseHooks struct {
	relay.NopHooks
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
	timer := newStmtTimer()
	el, err := b.drainInProcess(ctx, schema, sink, h, timer)
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
	timer.report(&out)

	// EXPLAIN the relay's claim (as internal/store renders it for worker 0
	// of this many, every lane owned by one relay id), on the same backlog
	// loaded again; then the raw loop's statement. Both in transactions
	// that are rolled back.
	if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
		return err
	}
	const owner = "bench-profile"
	claimSQL, claimArgs, err := claimStatement(schema, owner, b.cfg.workers, b.cfg.batch)
	if err != nil {
		return err
	}
	for _, q := range []struct {
		name, sql string
		args      []any
	}{
		{"relay claim (worker 0, rotation 0)", claimSQL, claimArgs},
		{"raw-SQL yardstick statement", rawClaimSQL(schema, b.cfg.batch), nil},
	} {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE "+migrations.Ident(schema)+".lanes SET owner = $1, lease_until = now() + interval '1 hour'", owner); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, store.NoSeqScan); err != nil {
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
	variants := []variant{
		{"BEGIN; relay claim (SELECT … FOR UPDATE); DELETE … WHERE ctid = ANY; COMMIT", shapeRelay},
		{"BEGIN; DELETE … WHERE ctid IN (relay claim without FOR UPDATE) RETURNING …; COMMIT", shapeDeleteInClaim},
	}
	for _, v := range variants {
		if _, err := b.pool.Exec(ctx, "TRUNCATE "+migrations.Ident(schema)+".messages"); err != nil {
			return err
		}
		if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
			return err
		}
		rate, err := b.shapeLoop(ctx, schema, owner, v.del)
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

// deleteClaim turns a claim the engine queued (positional arguments)
// into a DELETE … RETURNING of the rows it selects, without its per-row
// FOR UPDATE (the lane's FOR KEY SHARE lock and lease already make the
// worker the only one on the lane).
func deleteClaim(schema, claim string) string {
	inner := strings.Replace(claim, "    FOR UPDATE\n", "\n", 1)
	return "DELETE FROM " + migrations.Ident(schema) + ".messages WHERE ctid IN (SELECT c.row_ctid FROM (" + inner +
		") c) RETURNING id, lane, payload"
}

// Variants of the relay's SQL for shapeLoop.
const (
	shapeRelay = iota
	shapeDeleteInClaim
)

// shapeLoop drains schema with the relay's SQL and nothing else (no sink,
// no Go-side decoding beyond receiving the rows), in as many connections
// as the relay has workers, each claiming its own lanes of owner the way
// the relay's worker does (its next claim starts after the last lane a
// full claim took rows from). The claim is the one internal/store renders
// for the relay; shapeDeleteInClaim turns it into DELETE … RETURNING (one
// write per row instead of a row lock, then a delete). It returns
// messages per second.
func (b *bench) shapeLoop(ctx context.Context, schema, owner string, variant int) (float64, error) {
	s := migrations.Ident(schema)
	if _, err := b.pool.Exec(ctx, "UPDATE "+s+".lanes SET owner = $1, lease_until = now() + interval '1 hour'", owner); err != nil {
		return 0, err
	}
	sc, err := store.NewSchema(schema)
	if err != nil {
		return 0, err
	}
	eng := store.NewEngine(sc, store.Outbox, "", false)
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: b.cfg.databaseURL, Workers: b.cfg.workers})
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	// claimOnce runs one claim and settles it on c; it returns the rows
	// claimed and the lane of the last one.
	claimOnce := func(c *pgx.Conn, w, rotation int) (n int, last int16, err error) {
		var prio bool
		var ctids []pgtype.TID
		cb := &pgx.Batch{}
		cb.Queue("BEGIN")
		eng.QueueClaim(cb, store.ClaimParams{Relay: owner, Workers: b.cfg.workers, Worker: w, Rotation: rotation,
			Limit: b.cfg.batch, MaxBytes: 16 << 20}, &prio, func(r store.ClaimedRow) error {
			ctids = append(ctids, r.CTID)
			last = r.Lane
			return nil
		})
		if variant == shapeDeleteInClaim {
			q := cb.QueuedQueries[len(cb.QueuedQueries)-1]
			sql, args := deleteClaim(schema, q.SQL), q.Arguments
			cb.QueuedQueries = cb.QueuedQueries[:len(cb.QueuedQueries)-1]
			cb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					var id int64
					var payload []byte
					if err := rows.Scan(&id, &last, &payload); err != nil {
						return err
					}
					n++
				}
				return rows.Err()
			})
			cb.Queue("COMMIT")
			return n, last, c.SendBatch(ctx, cb).Close()
		}
		if err := c.SendBatch(ctx, cb).Close(); err != nil {
			return 0, 0, err
		}
		sb := &pgx.Batch{}
		if len(ctids) > 0 {
			eng.QueueDelete(sb, ctids)
		}
		sb.Queue("COMMIT")
		return len(ctids), last, c.SendBatch(ctx, sb).Close()
	}
	var total atomic.Int64
	start := time.Now()
	errc := make(chan error, b.cfg.workers)
	var wg sync.WaitGroup
	for w := range b.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				errc <- err
				return
			}
			defer conn.Release()
			rotation := w
			empty := 0
			for empty < 2 {
				n, last, err := claimOnce(conn.Conn(), w, rotation)
				if err != nil {
					errc <- err
					return
				}
				if n == b.cfg.batch {
					rotation = (int(last) + b.cfg.workers) % 256
				} else {
					rotation = (rotation + b.cfg.workers) % 256
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
