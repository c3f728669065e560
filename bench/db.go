package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// schemaPrefix names every schema this program creates, so leftovers of an
// interrupted run can be dropped without touching anyone else's.
const schemaPrefix = "obbench_"

// bench holds what every workload shares.
type bench struct {
	cfg       config
	pool      *pgxpool.Pool // the benchmark's own connections (loading, checks)
	log       *slog.Logger
	tmp       string
	rep       *report
	seq       atomic.Int64
	cliSink   map[string]bool // sink schemes the relay binary understands
	adminFlag bool            // the binary has --admin-addr

	warnedCheckpoint bool
}

func newBench(ctx context.Context, cfg config) (*bench, error) {
	pc, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at DATABASE_URL unreachable: %w", err)
	}
	tmp, err := os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, pool: pool, log: slog.Default(), tmp: tmp}
	b.dropLeftovers(ctx)
	if b.cfg.relayBin == "" {
		b.cfg.relayBin = filepath.Join(tmp, "outbox-relay")
		b.log.Info("building the relay binary", "out", b.cfg.relayBin)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.cfg.relayBin, "./cmd/outbox-relay")
		cmd.Dir = ".."
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/outbox-relay (in ..): %w", err)
		}
	}
	b.cliSink, b.adminFlag = b.probeSinks(ctx)
	return b, nil
}

func (b *bench) close() {
	b.pool.Close()
	os.RemoveAll(b.tmp)
}

// probeSinks reads the sink schemes listed by `outbox-relay run --help`.
func (b *bench) probeSinks(ctx context.Context) (map[string]bool, bool) {
	out, _ := exec.CommandContext(ctx, b.cfg.relayBin, "run", "--help").CombinedOutput()
	got := map[string]bool{}
	s := string(out)
	if i := strings.Index(s, "Sinks (--sink):"); i >= 0 {
		line, _, _ := strings.Cut(s[i+len("Sinks (--sink):"):], "\n")
		for _, f := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '.' }) {
			got[f] = true
		}
	}
	return got, strings.Contains(s, "--admin-addr")
}

func (b *bench) dropLeftovers(ctx context.Context) {
	rows, err := b.pool.Query(ctx, "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", schemaPrefix)
	if err != nil {
		return
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, n := range names {
		if ownerAlive(n) {
			continue // another benchmark running now on this database
		}
		b.dropSchema(ctx, n)
	}
}

// ownerAlive reports whether the schema name carries the pid of a process
// that still runs here (names are prefix_what_PID_seq): two benchmarks on
// one database must not drop each other's schemas.
func ownerAlive(name string) bool {
	parts := strings.Split(name, "_")
	if len(parts) < 3 {
		return false
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// newSchema creates a fresh, migrated outbox schema.
func (b *bench) newSchema(ctx context.Context, what string) (string, error) {
	name := fmt.Sprintf("%s%s_%d_%d", schemaPrefix, what, os.Getpid(), b.seq.Add(1))
	if _, err := migrations.Apply(ctx, b.pool, name); err != nil {
		return "", err
	}
	return name, nil
}

func (b *bench) dropSchema(ctx context.Context, name string) {
	ctx = context.WithoutCancel(ctx)
	if _, err := b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+migrations.Ident(name)+" CASCADE"); err != nil {
		b.log.Warn("drop schema", "schema", name, "error", err)
	}
	// DROP SCHEMA leaves the (then empty) publication behind.
	if _, err := b.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+migrations.Ident(migrations.Publication(name))); err != nil {
		b.log.Warn("drop publication", "schema", name, "error", err)
	}
}

// payloadSQL renders message number g (an SQL expression) as a 200-byte
// JSON document {"n":g,"p":"xxx…"}; receivers parse n back to check order
// and match latencies.
func payloadSQL(g string, size int) string {
	return fmt.Sprintf(`convert_to(rpad('{"n":' || %s || ',"p":"', %d, 'x') || '"}', 'UTF8')`, g, size-2)
}

// payloadGo is payloadSQL in Go.
func payloadGo(n int64, size int) []byte {
	b := make([]byte, 0, size)
	b = fmt.Appendf(b, `{"n":%d,"p":"`, n)
	for len(b) < size-2 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// keyOf is the ordering key of message g with the given number of keys
// (1 = a single hot key).
func keySQL(g string, keys int) string {
	if keys == 1 {
		return "'hot'"
	}
	return fmt.Sprintf("'key-' || (%s %% %d)", g, keys)
}

// backlogSQL is the one statement that fills the outbox with n messages.
func (b *bench) backlogSQL(schema string, n, keys int) string {
	return fmt.Sprintf(`INSERT INTO %s.messages (topic, key, payload)
SELECT 'bench', %s, %s FROM generate_series(1, %d) AS g`,
		migrations.Ident(schema), keySQL("g", keys), payloadSQL("g", b.cfg.payload), n)
}

// loadBacklog fills schema's outbox with n messages over keys keys, then
// VACUUM ANALYZEs it so every run starts from the same table state.
func (b *bench) loadBacklog(ctx context.Context, schema string, n, keys int) error {
	start := time.Now()
	if _, err := b.pool.Exec(ctx, b.backlogSQL(schema, n, keys)); err != nil {
		return fmt.Errorf("load backlog: %w", err)
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+migrations.Ident(schema)+".messages"); err != nil {
		return fmt.Errorf("vacuum analyze: %w", err)
	}
	b.checkpoint(ctx)
	b.log.Info("backlog loaded", "schema", schema, "messages", n, "keys", keys, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// horizonWait is how long a measurement waits for other sessions' long
// transactions to end before it starts anyway (and says so).
const horizonWait = 30 * time.Second

// oldestOtherXact returns the age of the oldest transaction of another
// session that holds back the xmin horizon. While one is open, the rows
// a drain deletes stay in the indexes as entries every claim has to step
// over, so claim loops that start at the low end of an index (the raw-SQL
// yardstick most of all) slow down quadratically.
func (b *bench) oldestOtherXact(ctx context.Context) (time.Duration, string) {
	var age float64
	var who string
	err := b.pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM now() - xact_start), 0),
       coalesce(nullif(application_name, ''), 'pid ' || pid) || ' (' || state || ')'
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND backend_xmin IS NOT NULL AND xact_start IS NOT NULL
ORDER BY xact_start LIMIT 1`).Scan(&age, &who)
	if err != nil {
		return 0, ""
	}
	return time.Duration(age * float64(time.Second)), who
}

// awaitHorizon waits (up to horizonWait) until no other session has had a
// transaction open for more than 5s, and returns a note for the row when
// it gave up waiting.
func (b *bench) awaitHorizon(ctx context.Context) string {
	deadline := time.Now().Add(horizonWait)
	for {
		age, who := b.oldestOtherXact(ctx)
		if age < 5*time.Second {
			return ""
		}
		if time.Now().After(deadline) {
			b.log.Warn("another session holds an old transaction open; measuring anyway", "age", age.Round(time.Second), "session", who)
			return fmt.Sprintf("another session (%s) had a transaction open for %s during this run: dead index entries could not be cleaned up", who, age.Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(time.Second):
		}
	}
}

// checkpoint flushes the load's dirty pages before the clock starts, so
// that a checkpoint triggered by the previous run's WAL does not land in
// the middle of this one (it did, and made 1M-message drains take 8 s
// instead of 4.5 s). It needs superuser or pg_checkpoint; without them
// runs are just noisier.
func (b *bench) checkpoint(ctx context.Context) { b.checkpointOn(ctx, b.pool) }

// checkpointOn is checkpoint on the server of pool.
func (b *bench) checkpointOn(ctx context.Context, pool *pgxpool.Pool) {
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil && !b.warnedCheckpoint {
		b.warnedCheckpoint = true
		b.log.Warn("CHECKPOINT before measuring failed; runs will be noisier", "error", err)
	}
}

func (b *bench) countMessages(ctx context.Context, schema string) (int64, error) {
	var n int64
	s := migrations.Ident(schema)
	err := b.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+s+".messages) + (SELECT count(*) FROM "+s+".deliveries)").Scan(&n)
	return n, err
}

func (b *bench) countDead(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+migrations.Ident(schema)+".dead_letters").Scan(&n)
	return n, err
}

// drained waits up to scalingLimit for schema's outbox of n messages to
// empty and returns when it did and how many were delivered: all n, or,
// when the limit passed first, those delivered by then (the run is rated
// on them and r says so).
func (b *bench) drained(ctx context.Context, r *row, schema string, n int) (time.Time, int, error) {
	end, err := b.waitEmpty(ctx, schema, scalingLimit)
	if err == nil {
		return end, n, nil
	}
	left, cerr := b.countMessages(ctx, schema)
	if cerr != nil {
		return time.Time{}, 0, err
	}
	delivered := n - int(left)
	r.addNote("run %d: not empty after %s, rated on the %d delivered", len(r.Rates)+1, scalingLimit, delivered)
	return time.Now(), delivered, nil
}

// waitEmpty polls until schema's outbox is empty and returns when it was
// first seen empty.
func (b *bench) waitEmpty(ctx context.Context, schema string, deadline time.Duration) (time.Time, error) {
	q := "SELECT NOT EXISTS (SELECT 1 FROM " + migrations.Ident(schema) + ".messages)"
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	for {
		var empty bool
		if err := b.pool.QueryRow(ctx, q).Scan(&empty); err != nil {
			return time.Time{}, fmt.Errorf("outbox not empty after %s: %w", deadline, err)
		}
		if empty {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("outbox not empty after %s", deadline)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func machineInfo(ctx context.Context, b *bench) map[string]string {
	m := map[string]string{
		"nproc": fmt.Sprint(runtime.NumCPU()),
		"go":    runtime.Version(),
	}
	if out, err := exec.CommandContext(ctx, "free", "-h").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "Mem:") {
				f := strings.Fields(l)
				if len(f) > 1 {
					m["memory"] = f[1]
				}
			}
		}
	}
	if cpu, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(cpu), "\n") {
			if strings.HasPrefix(l, "model name") {
				_, v, _ := strings.Cut(l, ":")
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", "..", "describe", "--always", "--dirty").Output(); err == nil {
		m["relay_commit"] = strings.TrimSpace(string(out))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_at_start"] = strings.Join(strings.Fields(string(la))[:3], " ")
	}
	var v string
	if b.pool.QueryRow(ctx, "SELECT version()").Scan(&v) == nil {
		m["postgres"] = v
	}
	for _, s := range []string{"shared_buffers", "synchronous_commit", "fsync", "autovacuum", "max_wal_size"} {
		var val string
		if b.pool.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&val) == nil {
			m["pg."+s] = val
		}
	}
	return m
}
