// Command bench is outbox-relay's benchmark suite. It measures, against
// the local Postgres and in one run:
//
//   - the raw-SQL limit: the tightest claim+delete loop in pgx on the same
//     table, the yardstick every other row is divided by;
//   - backlog drains by the real outbox-relay binary into the discard, HTTP,
//     Kafka (kfake, in this process) and RabbitMQ sinks, with peak RSS;
//   - the writer tax: 16 single-row writers into the outbox while a relay
//     drains it, against the same writers into a plain table;
//   - the idle cost: database transactions/s of 16 idle relays, and the
//     latency of the first message after the idle spell;
//   - commit-to-receive latency of single-message transactions at fixed
//     rates (1,000, 50 and 5,000 a second; the writers' achieved rate says
//     whether they kept up) and at the writers' full speed, through the
//     HTTP sink and through Kafka;
//   - live rates: one relay's CPU and its database sessions' CPU per
//     message at 100, 1,000 and 5,000 msg/s and idle, against its own
//     100k drain's per-message cost and against a floor (a raw poll loop,
//     or a logical-replication reader where the relay follows the WAL) in
//     the same run;
//   - many sources (sources.go, sourceslat.go, on throwaway clusters): the
//     CPU of one relay process idle on 50 sources against a relay of one
//     database idle beside it; and 3 quiet sources' commit-to-webhook
//     p99 in one process while a 4th is idle, drains a 200k backlog or
//     has its database stopped;
//   - 1..16 relay processes draining a 1,000-key and a single-key backlog,
//     with per-key order checked on the output;
//   - River and Watermill's SQL subscriber draining the same backlog.
//
// Run it from this directory: `go run .` (BENCH_QUICK=1 for a short run).
// Results are printed as markdown and written to results/latest.{md,json}.
// Environment:
//
//	DATABASE_URL      Postgres (default postgres://postgres@127.0.0.1:5432/test)
//	BENCH_QUICK=1     short run (< 3 min): fewer messages, 1 run per row
//	BENCH_RUNS        repeats per row (default 3, quick 1)
//	BENCH_WORKERS     the relay's --workers, and the raw loops' connections (default 2)
//	BENCH_N           backlog size (default 1,000,000, quick 200,000)
//	BENCH_KEYS        distinct keys in the backlog (default 1,000; scaling adds a one-key backlog)
//	BENCH_ONLY        comma-separated groups: raw,drain,writertax,idle,latency,live,sources,scaling,together,rebalance,peers,brokers
//	BENCH_AMQP_URL    RabbitMQ (default amqp://guest:guest@127.0.0.1:5672/); "off" skips
//	BENCH_NATS_URL    NATS with JetStream for the brokers group (default nats://127.0.0.1:4222); "off" skips
//	BENCH_REDIS_URL   Redis for the brokers group (default redis://127.0.0.1:6379/0); "off" skips
//	BENCH_BROKER_N    backlog size of the brokers group (default 200,000, quick 50,000)
//	BENCH_RELAY_BIN   use this outbox-relay binary instead of building one
//	BENCH_PROCS       relay process counts of the scaling and together groups (default 1,2,4,16; quick 1,2,4)
//	BENCH_BASE_BIN    together group: also run this (baseline) binary, alternating
//	BENCH_SINKS       together group: sinks (default discard,kafka)
//	BENCH_OUT         results directory (default results)
//	BENCH_LIVE_SINKS, BENCH_LIVE_RATES  live group: only these sinks (discard, kafka, nats) and offered rates (100, 1000, 5000)
//	BENCH_LIVE_WAL    live group: 1 adds its rows on a throwaway cluster with wal_level = logical,
//	                  relay --wakeup wal and --wakeup poll (livewal.go); "only" runs just those
//	BENCH_PROFILE=1   instead of benchmarking, profile the relay's drain (see profile.go)
//	BENCH_PROFILE=live  instead of benchmarking, a 20 s CPU profile of the relay binary at 100 msg/s (live.go)
//	BENCH_PROFILE_RATE  the rate of BENCH_PROFILE=live, messages a second (default 100)
//	BENCH_RENDER=f    re-render the markdown of a results JSON file (after a format change)
//	BENCH_SRC_ARGS    sources group: more arguments for every relay it starts (e.g. "--source-batches 1000")
//	BENCH_SRC_NOIDLE=1  sources group: only its latency rows
//
// Nothing here is pass/fail: targets are printed next to the figures.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the benchmark run's configuration, from the environment.
type config struct {
	quick       bool
	runs        int
	n           int // backlog size for drains and peers
	scaleN      int // backlog size for scaling rows
	httpN       int // backlog size for the HTTP sink drain (one request per message)
	amqpN       int // backlog size for the RabbitMQ drain (publisher confirms)
	hotN        int // backlog size of single-key drains
	keys        int
	payload     int
	batch       int
	workers     int
	databaseURL string
	amqpURL     string
	natsURL     string
	redisURL    string
	brokerN     int // backlog size for the NATS and Redis rows (brokers.go)
	relayBin    string
	outDir      string
	only        map[string]bool
	procs       []int
	latency     []latencySpec
	maxRateDur  time.Duration
	taxDur      time.Duration // writers' time per writer-tax run
	idleSettle  time.Duration // idle row: wait after the relays registered
	idleWindow  time.Duration // idle row: measurement window (and idle spell)
	wmCap       time.Duration // time cap for Watermill's default (slow) adapter
	liveWAL     string        // BENCH_LIVE_WAL: "", "1" or "only"
}

func loadConfig() (config, error) {
	c := config{
		quick:       os.Getenv("BENCH_QUICK") == "1",
		keys:        1000,
		payload:     200,
		batch:       500,
		workers:     2,
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
		amqpURL:     envOr("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		natsURL:     envOr("BENCH_NATS_URL", "nats://127.0.0.1:4222"),
		redisURL:    envOr("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
		relayBin:    os.Getenv("BENCH_RELAY_BIN"),
		outDir:      envOr("BENCH_OUT", "results"),
		liveWAL:     os.Getenv("BENCH_LIVE_WAL"),
	}
	if c.quick {
		c.runs, c.n, c.scaleN, c.httpN, c.amqpN = 1, 200_000, 100_000, 100_000, 50_000
		c.hotN = 20_000
		c.brokerN = 50_000
		c.procs = []int{1, 2, 4}
		c.latency = []latencySpec{{rate: 1000, dur: 5 * time.Second}, {rate: 50, dur: 8 * time.Second}, {rate: 5000, dur: 5 * time.Second}}
		c.maxRateDur = 4 * time.Second
		c.taxDur = 4 * time.Second
		// Settle past 10s: an idle backend reports its transactions to
		// pg_stat_database up to 10s late (PG 15's idle flush interval), so
		// a shorter settle counts the relays' start-up in the idle window
		// (measured: 82–95 tx/s after 5s, 23 tx/s sampled later in the
		// same run).
		c.idleSettle, c.idleWindow = 12*time.Second, 20*time.Second
		c.wmCap = 8 * time.Second
	} else {
		c.runs, c.n, c.scaleN, c.httpN, c.amqpN = 3, 1_000_000, 200_000, 200_000, 100_000
		c.hotN = 50_000
		c.brokerN = 200_000
		c.procs = []int{1, 2, 4, 16}
		c.latency = []latencySpec{{rate: 1000, dur: 10 * time.Second}, {rate: 50, dur: 15 * time.Second}, {rate: 5000, dur: 10 * time.Second}}
		c.maxRateDur = 6 * time.Second
		c.taxDur = 8 * time.Second
		c.idleSettle, c.idleWindow = 12*time.Second, 60*time.Second
		c.wmCap = 10 * time.Second
	}
	var err error
	if v := os.Getenv("BENCH_WORKERS"); v != "" {
		if c.workers, err = strconv.Atoi(v); err != nil || c.workers < 1 || c.workers > 256 {
			return c, fmt.Errorf("BENCH_WORKERS: want an integer in 1..256, got %q", v)
		}
	}
	if v := os.Getenv("BENCH_RUNS"); v != "" {
		if c.runs, err = strconv.Atoi(v); err != nil || c.runs < 1 {
			return c, fmt.Errorf("BENCH_RUNS: want a positive integer, got %q", v)
		}
	}
	if v := os.Getenv("BENCH_N"); v != "" {
		if c.n, err = strconv.Atoi(v); err != nil || c.n < 1000 {
			return c, fmt.Errorf("BENCH_N: want an integer >= 1000, got %q", v)
		}
		c.scaleN, c.httpN, c.amqpN = min(c.scaleN, c.n), min(c.httpN, c.n), min(c.amqpN, c.n)
		c.hotN = min(c.hotN, c.n)
		c.brokerN = min(c.brokerN, c.n)
	}
	switch c.liveWAL {
	case "", "1", "only":
	case "0":
		c.liveWAL = ""
	default:
		return c, fmt.Errorf("BENCH_LIVE_WAL: want 1 or only, got %q", c.liveWAL)
	}
	if v := os.Getenv("BENCH_BROKER_N"); v != "" {
		if c.brokerN, err = strconv.Atoi(v); err != nil || c.brokerN < 1000 {
			return c, fmt.Errorf("BENCH_BROKER_N: want an integer >= 1000, got %q", v)
		}
	}
	if v := os.Getenv("BENCH_KEYS"); v != "" {
		if c.keys, err = strconv.Atoi(v); err != nil || c.keys < 1 {
			return c, fmt.Errorf("BENCH_KEYS: want a positive integer, got %q", v)
		}
	}
	if v := os.Getenv("BENCH_PROCS"); v != "" {
		c.procs = nil
		for _, f := range strings.Split(v, ",") {
			p, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || p < 1 {
				return c, fmt.Errorf("BENCH_PROCS: want comma-separated positive integers, got %q", v)
			}
			c.procs = append(c.procs, p)
		}
	}
	c.only = map[string]bool{}
	for _, g := range strings.Split(os.Getenv("BENCH_ONLY"), ",") {
		if g = strings.TrimSpace(g); g != "" {
			c.only[g] = true
		}
	}
	return c, nil
}

func (c config) want(group string) bool { return len(c.only) == 0 || c.only[group] }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	if child, err := floorChild(); child {
		return err
	}
	if path := os.Getenv("BENCH_RENDER"); path != "" {
		return render(path)
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := newBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()

	switch os.Getenv("BENCH_PROFILE") {
	case "1":
		return b.profile(ctx)
	case "live":
		return b.profileLive(ctx)
	}

	started := time.Now()
	rep := &report{
		Started: started.UTC().Format(time.RFC3339),
		Mode:    map[bool]string{true: "quick", false: "full"}[cfg.quick],
		Machine: machineInfo(ctx, b),
		Command: commandLine(cfg),
	}
	b.rep = rep

	if err := b.runGroups(ctx); err != nil {
		return err
	}
	rep.Duration = time.Since(started).Round(time.Second).String()
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.Machine["loadavg_at_end"] = strings.Join(strings.Fields(string(la))[:3], " ")
	}
	md := rep.markdown()
	fmt.Println(md)
	if err := os.MkdirAll(cfg.outDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.outDir, "latest.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := rep.json()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.outDir, "latest.json"), js, 0o644)
}

// benchGroup is a group of rows and what runs it; names are the
// BENCH_ONLY names that select it.
type benchGroup struct {
	names []string
	run   func(context.Context) error
}

// groups are the benchmark groups in the order they run (raw and drain
// run together).
func (b *bench) groups() []benchGroup {
	return []benchGroup{
		{[]string{"raw", "drain"}, b.drains},
		{[]string{"writertax"}, b.writerTax},
		{[]string{"idle"}, b.idleCost},
		{[]string{"latency"}, b.latencies},
		{[]string{"live"}, b.live},
		{[]string{"sources"}, b.sources},
		{[]string{"scaling"}, b.scaling},
		{[]string{"together"}, b.together},
		{[]string{"rebalance"}, b.rebalance},
		{[]string{"peers"}, b.peers},
		{[]string{"brokers"}, b.brokers},
	}
}

// runGroups runs the groups that BENCH_ONLY asks for (all without it).
func (b *bench) runGroups(ctx context.Context) error {
	for _, g := range b.groups() {
		if slices.ContainsFunc(g.names, b.cfg.want) {
			if err := g.run(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func commandLine(cfg config) string {
	var env []string
	for _, k := range []string{"BENCH_QUICK", "BENCH_RUNS", "BENCH_N", "BENCH_KEYS", "BENCH_ONLY", "BENCH_LIVE_WAL"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return strings.TrimSpace(strings.Join(env, " ") + " go run . (in bench/, " + runtime.Version() + ")")
}

// render rewrites the markdown next to a results JSON file from it,
// recomputing the ratios.
func render(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		return err
	}
	rows := rep.Rows
	rep.Rows = nil
	for _, r := range rows {
		if strings.HasPrefix(r.Name, "raw SQL") && len(r.Rates) > 0 {
			rep.RawRate, rep.RawBest = r.Rate, slices.Max(r.Rates)
		}
	}
	for _, r := range rows {
		if r.Group != "writertax" && r.Group != "idle" && r.Group != "live" && r.Group != "sources" { // not divided by raw SQL
			r.Ratio, r.RatioBest = 0, 0
		}
		rep.add(r)
	}
	md := rep.markdown()
	fmt.Println(md)
	js, err := rep.json()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(strings.TrimSuffix(path, ".json")+".md", []byte(md), 0o644)
}
