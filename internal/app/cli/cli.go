// Package cli implements the outbox-relay command line: flag, environment
// and config-file handling, and the migrate, run, status, dlq and version
// commands. cmd/outbox-relay only calls Main.
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	otelprom "go.opentelemetry.io/contrib/bridges/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/app/adminhttp"
	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
)

// Version and Commit are set at build time by make build and the
// Dockerfile: -ldflags "-X ...cli.Version=v0.1.0 -X ...cli.Commit=<sha>".
// Left empty (go install, go build), they come from the binary's build
// information.
var (
	Version = ""
	Commit  = ""
)

// version is the version this binary reports: in the version command,
// the relays table, the console and the build-info metric.
func version() string {
	v, _ := versionInfo()
	return v
}

// versionInfo returns the version and the commit this binary was built
// from.
func versionInfo() (version, commit string) {
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(Version, Commit, bi)
}

// buildVersion returns the version and the commit of a binary: those set
// with -ldflags, else from its build information bi (nil: none). go
// install module@v0.1.0 records the module's version and no commit (a
// pseudo-version names its commit); go build and go install in a clone
// record the commit (vcs.revision, -dirty with uncommitted changes) and
// a version derived from the tags. The version drops a leading "v" (0.1.0,
// as the changelog, the image tag and the chart name it); "dev" and
// "unknown" stand for what no source says.
func buildVersion(ldVersion, ldCommit string, bi *debug.BuildInfo) (version, commit string) {
	version, commit = ldVersion, ldCommit
	if bi != nil {
		if version == "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		if commit == "" {
			commit = buildCommit(bi)
		}
	}
	if len(version) > 1 && version[0] == 'v' && version[1] >= '0' && version[1] <= '9' {
		version = version[1:]
	}
	return cmp.Or(version, "dev"), cmp.Or(commit, "unknown")
}

// pseudoVersionRev is the commit at the end of a Go pseudo-version
// (v0.1.1-0.20261128093000-1d16b85a3c4e, +dirty or +incompatible after it).
var pseudoVersionRev = regexp.MustCompile(`[.-]\d{14}-([0-9a-f]{12})(?:\+.*)?$`)

// buildCommit is the commit recorded in bi: vcs.revision, else the one a
// pseudo-version names.
func buildCommit(bi *debug.BuildInfo) string {
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		if m := pseudoVersionRev.FindStringSubmatch(bi.Main.Version); m != nil {
			return m[1]
		}
		return ""
	}
	if modified {
		rev += "-dirty"
	}
	return rev
}

// globals are the options every command shares.
type globals struct {
	configPath  string
	databaseURL string
	schema      string
	logLevel    string
	logFormat   string
	// The database password's source instead of the URL (dbpassword.go).
	passwordFile, passwordCommand, iamAuth string
	// sourceName is --source; sources the config file's sources list
	// (only the chosen one with --source).
	sourceName string
	sources    []source
	// known are the config file's keys (for reading it again).
	known map[string]bool

	file    *fileConfig
	files   envFiles          // what was read through *_FILE variables
	origins map[string]string // where each option's value came from (see resolve)
	stdout  io.Writer
	stderr  io.Writer
	log     *slog.Logger
}

// Main runs the command line and returns the process exit status: 0 on
// success, 2 for invalid configuration or usage, 1 for other failures.
func Main(args []string, stdout, stderr io.Writer) int {
	return MainContext(context.Background(), args, stdout, stderr)
}

// MainContext is Main with a context whose end stops the command as
// SIGTERM does: the program's main cancels it on SIGTERM and SIGINT from
// its first instruction, so that a stop during start-up is a stop (exit
// 0), not the signal's default action.
func MainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	// A value read through a *_FILE variable is never printed, whichever
	// part of the command put it in its error.
	fmt.Fprintln(stderr, "outbox-relay:", g.files.scrub(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, migrations.ErrServerEncoding) {
		return 2 // a database the relay refuses is configuration to change, as a bad flag is
	}
	return 1
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox-relay",
		Short: "Publish Postgres outbox rows to Kafka, RabbitMQ, webhooks and more",
		Long: `outbox-relay moves events that applications commit into a Postgres outbox
table (in the same transaction as their business data) to a message sink,
at least once, in order per key, with persisted retries and a dead-letter
table.

Every option can be given as a flag, as an environment variable (shown in
each flag's help) or as a key of the YAML file named by --config, in that
order of precedence. Config-file keys are the long flag names.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.prepare(cmd)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.configPath, "config", "", "YAML config file; keys are long flag names (env OUTBOX_CONFIG)")
	pf.StringVar(&g.databaseURL, "database-url", "", "Postgres URL, e.g. postgres://user:pass@host:5432/db")
	pf.StringVar(&g.passwordFile, optPasswordFile, "", "file holding the database password, read again for each new connection (a secret manager may rewrite it); replaces the URL's password")
	pf.StringVar(&g.passwordCommand, optPasswordCommand, "", "shell command (sh -c) that prints the database password, run when a new connection needs one (output reused 10s, 30s timeout); replaces the URL's password")
	pf.StringVar(&g.iamAuth, optIAMAuth, "", "aws: sign in with AWS RDS/Aurora IAM tokens (region and credentials from the AWS SDK's defaults; needs sslmode=require or stricter); replaces the URL's password")
	pf.StringVar(&g.schema, "schema", migrations.DefaultSchema, "schema holding the outbox tables")
	pf.StringVar(&g.sourceName, "source", "", "the source, of the config file's sources list, that the command acts on (its database-url and schema): run relays from it alone, status and the dead-letter commands read it (default: run relays from every source, status shows every source)")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text or json (logs go to stderr)")

	root.AddCommand(newMigrate(g), newRun(g), newStatus(g), newDLQ(g), newReplay(g), newHealthcheck(g), newVersion(g))
	root.CompletionOptions.DisableDefaultCmd = true
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		envHelp(c.LocalNonPersistentFlags())
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	envHelp(pf)
	// --config's own env var is handled before the file is read.
	pf.Lookup("config").Usage = "YAML config file; keys are long flag names (env OUTBOX_CONFIG)"
	return root
}

// prepare applies env and file values, validates the shared options and
// sets up logging.
func (g *globals) prepare(cmd *cobra.Command) error {
	ef := &g.files
	if !cmd.Flags().Changed("config") {
		if v, ok, err := lookupEnv("config", "OUTBOX_CONFIG", ef); err != nil {
			return err
		} else if ok {
			g.configPath = v
		}
	}
	g.known = allFlagNames(cmd.Root())
	fc, err := loadFile(g.configPath, g.known)
	if err != nil {
		return err
	}
	g.file = fc
	g.origins = map[string]string{}
	if err := resolve(cmd, fc, ef, g.origins); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return usagef("outbox: log-level: %q is not one of debug, info, warn, error", g.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		g.log = slog.New(slog.NewTextHandler(g.stderr, opts))
	case "json":
		g.log = slog.New(slog.NewJSONHandler(g.stderr, opts))
	default:
		return usagef("outbox: log-format: %q is not text or json", g.logFormat)
	}
	if err := migrations.ValidateSchema(g.schema); err != nil {
		return &usageError{err}
	}
	if g.sources, err = g.parseSources(); err != nil {
		return err
	}
	warnReadable(g.log, ef.readable)
	return g.pickSource()
}

func (g *globals) requireDatabase() error {
	if g.databaseURL == "" && len(g.sources) > 0 {
		return usagef("outbox: source: the config file lists sources (%s): give --source to pick the one this command acts on", strings.Join(g.sourceNames(), ", "))
	}
	if g.databaseURL == "" {
		return usagef("outbox: database-url: required (flag --database-url, env DATABASE_URL or OUTBOX_DATABASE_URL)")
	}
	if _, err := pgxpool.ParseConfig(g.databaseURL); err != nil {
		if err := databaseScheme(g.databaseURL); err != nil {
			return err
		}
		return usagef("outbox: database-url: cannot parse %s", redactURL(g.databaseURL))
	}
	return nil
}

// urlScheme matches the scheme of a value written as a URL.
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// databaseScheme reports a database URL whose scheme pgx does not take
// (pgx reads anything but postgres:// and postgresql:// as key=value
// settings, and its error would only say that they do not parse).
func databaseScheme(raw string) error {
	m := urlScheme.FindStringSubmatch(raw)
	if m == nil || m[1] == "postgres" || m[1] == "postgresql" {
		return nil
	}
	hint := ""
	for _, s := range []string{"postgres", "postgresql"} {
		if editDistance(strings.ToLower(m[1]), s) <= 2 {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
			break
		}
	}
	return usagef("outbox: database-url: scheme %q is not one Postgres takes%s: write postgres:// or postgresql://, or key=value settings (host=... dbname=...)",
		redactURL(m[1]), hint)
}

// connect opens a small pool for the admin commands.
func (g *globals) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if err := g.requireDatabase(); err != nil {
		return nil, err
	}
	password, _, err := g.databasePassword(ctx, g.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg, _ := pgxpool.ParseConfig(g.databaseURL)
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-relay-admin"
	if password != nil {
		cfg.BeforeConnect = withPassword(password)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: connect to %s: %w", redactURL(g.databaseURL), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("outbox: connect to %s: %w", redactURL(g.databaseURL), err)
	}
	return pool, nil
}

func newMigrate(g *globals) *cobra.Command {
	var print bool
	var wakeup string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox schema (safe to run concurrently)",
		Long: `Applies the embedded SQL migrations to the schema under an advisory lock, in
one transaction; running it twice, or from two places at once, is safe.
With --print it writes the SQL to stdout instead, for teams that apply
migrations with their own tool.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if print {
				s, err := migrations.Script(g.schema)
				if err != nil {
					return &usageError{err}
				}
				_, err = io.WriteString(g.stdout, s)
				return err
			}
			if wakeup != "" {
				if err := (relay.Config{Wakeup: wakeup}).WithDefaults().Validate(); err != nil {
					return &usageError{err}
				}
			}
			return g.forEachSource(func(string) error { return g.migrate(cmd.Context(), wakeup) })
		},
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the migration SQL instead of applying it")
	cmd.Flags().StringVar(&wakeup, "wakeup", "", "notify: enable the writers' NOTIFY trigger (for run --wakeup notify; the writers pay for it); auto, wal or poll: disable it (the default since schema version 9). Unset: leave it as it is")
	return cliOnly(cmd)
}

// migrate applies the migrations to the command's schema and, when
// wakeup is set, sets the writers' trigger.
func (g *globals) migrate(ctx context.Context, wakeup string) error {
	pool, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := migrations.Apply(ctx, pool, g.schema)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		g.log.Info("schema is up to date", "schema", g.schema, "version", migrations.Latest())
	} else {
		g.log.Info("schema migrated", "schema", g.schema, "applied", applied)
	}
	if wakeup != "" {
		if err := migrations.SetWakeup(ctx, pool, g.schema, wakeup); err != nil {
			return err
		}
		g.log.Info("writers' NOTIFY trigger set", "schema", g.schema, "wakeup", wakeup, "trigger_enabled", wakeup == relay.WakeupNotify)
	}
	return nil
}

type runOptions struct {
	sink            string
	workers         int
	pipeline        int
	batchSize       int
	batchBytes      int64
	maxMessageBytes int64
	maxConns        int
	sourceBatches   int
	pollInterval    time.Duration
	wakeup          string
	watchInterval   time.Duration
	publishTimeout  time.Duration
	maxAttempts     int
	rateLimit       float64
	rateBurst       int
	retryInitial    time.Duration
	retryMax        time.Duration
	retryMultiplier float64
	retryJitter     float64
	leaseTTL        time.Duration
	heartbeat       time.Duration
	drainTimeout    time.Duration
	syncCommit      bool
	noFastFailover  bool
	migrate         bool
	exitWhenEmpty   bool
	allowConfChange bool
	onConfChange    string
	id              string
	producer        string
	adminAddr       string
	adminTokenFile  string
	adminReadToken  bool
	adminOpenPay    bool
	pprof           bool
	consoleSample   time.Duration
	consoleFailing  time.Duration
	metricsInterval time.Duration
	archive         bool
	isolateRoutes   bool
	readiness       string
	archiveRetain   time.Duration
	connectTimeout  time.Duration
	onDeadLetter    string
	format          string
	ceSource        string
	ceAMQPPrefix    string
}

func newRun(g *globals) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Relay outbox messages to a sink until SIGTERM/SIGINT",
		Long: `Claims committed outbox messages, publishes them to the sink and deletes
what the sink accepted. Failed deliveries are retried with exponential
backoff; after --max-attempts, or on a permanent error, a message moves to
the dead-letter table. On SIGTERM or SIGINT the relay stops claiming,
finishes in-flight batches (up to --drain-timeout), hands its lanes to
other relays and exits 0.

Database connections: per route, one per batch in flight (--workers ×
--pipeline) and one for the lane lease; one LISTEN connection for the
process; and one for health checks and metrics: 7 with the defaults.
--max-conns caps them all (it must leave every worker, lease and LISTEN
one connection; below the full count, workers have fewer batches in
flight); a relay whose workers cannot get a connection for --lease-ttl
hands its lanes to other relays.

Sinks (--sink): ` + strings.Join(sinkSchemes, ", ") + `.`,
		Example: `  outbox-relay run --database-url postgres://localhost/app --sink stdout`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.sink, "sink", "", "where to publish, as a URL: stdout, discard, kafka://host:9092,host2:9092, amqp://user:pass@host:5672/vhost?exchange=x, https://host/path (each sink's options: docs/sinks/)")
	f.IntVar(&o.workers, "workers", relay.DefaultWorkers, "claim loops in this process (each holds one connection)")
	f.IntVar(&o.pipeline, "pipeline", relay.DefaultPipeline, "most batches each worker has in flight: it claims the next from its other lanes while the sink takes one (each holds a connection; 1: one batch at a time)")
	f.IntVar(&o.sourceBatches, "source-batches", relay.DefaultSourceBatches, "with a sources list: how many batches all sources have under way at once (claimed, not yet answered by the sink) while several have work, each source its part by its weight (at least one); a source alone is not held back (docs/operations.md, \"Many databases\")")
	f.IntVar(&o.maxConns, "max-conns", 0, "most database connections this process opens, LISTEN and lane leases included (default: what the workers' batches in flight, leases and LISTEN need, plus one for health checks and metrics)")
	f.IntVar(&o.batchSize, "batch-size", relay.DefaultBatchSize, "most messages claimed and published at once")
	f.Int64Var(&o.batchBytes, "batch-bytes", relay.DefaultBatchBytes, "most payload bytes claimed and published at once (16 MiB); a larger message goes alone")
	f.Int64Var(&o.maxMessageBytes, "max-message-bytes", relay.DefaultMaxMessageBytes, "largest message (payload and headers) the relay reads (17 MiB); a larger one is dead-lettered without being read")
	f.DurationVar(&o.pollInterval, "poll-interval", relay.DefaultPollInterval, "how often idle workers look for work when nothing wakes them (a safety net)")
	f.StringVar(&o.wakeup, "wakeup", relay.DefaultWakeup, fmt.Sprintf("how relays learn of new rows: %s (%s where the server allows it, else %s), %s (follow the outbox's inserts in the WAL), %s (one relay per database polls and wakes the others), %s (the writers' trigger; the writers pay for it)",
		relay.WakeupAuto, relay.WakeupWAL, relay.WakeupPoll, relay.WakeupWAL, relay.WakeupPoll, relay.WakeupNotify))
	f.DurationVar(&o.watchInterval, "watch-interval", relay.DefaultWatchInterval, "longest wait between two looks for new rows of the polling watcher when idle")
	f.DurationVar(&o.publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "longest a sink may take to accept a batch")
	f.IntVar(&o.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "failed deliveries before a message is dead-lettered")
	f.Float64Var(&o.rateLimit, "rate-limit", 0, "most messages a second this process delivers per route, shared by its workers (0: no limit; with several relays on a route, give each its share)")
	f.IntVar(&o.rateBurst, "rate-burst", 0, "most messages delivered at once under --rate-limit, and so the largest batch (default: the rate limit, rounded up)")
	f.StringVar(&o.onDeadLetter, "on-dead-letter", relay.OnDeadLetterSkip, fmt.Sprintf("what a dead letter does to the later messages of its key: %s (they go on) or %s (they wait, in order, until the dead letter is replayed or purged)", relay.OnDeadLetterSkip, relay.OnDeadLetterHold))
	f.DurationVar(&o.retryInitial, "retry-initial", relay.DefaultRetryInitial, "delay after the first failure")
	f.DurationVar(&o.retryMax, "retry-max", relay.DefaultRetryMax, "longest delay between attempts")
	f.Float64Var(&o.retryMultiplier, "retry-multiplier", relay.DefaultRetryMultiplier, "growth of the delay after each failure")
	f.Float64Var(&o.retryJitter, "retry-jitter", relay.DefaultRetryJitter, "randomization of each delay, 0 to 1")
	f.DurationVar(&o.leaseTTL, "lease-ttl", relay.DefaultLeaseTTL, "how long a dead relay's lanes wait before others take them")
	f.DurationVar(&o.heartbeat, "heartbeat", 0, "how often lanes are renewed and rebalanced (default lease-ttl/3)")
	f.DurationVar(&o.drainTimeout, "drain-timeout", 0, "on shutdown, how long in-flight batches may finish before they are rolled back (default publish-timeout)")
	f.BoolVar(&o.syncCommit, "synchronous-commit", false, "keep synchronous_commit on for the relay's sessions (off costs only redeliveries after a database crash)")
	f.BoolVar(&o.noFastFailover, "disable-fast-failover", false, "do not treat relays whose connection vanished from pg_stat_activity as dead; only their heartbeat's age tells (relays behind PgBouncer are never judged by their connection)")
	f.BoolVar(&o.migrate, "migrate", false, "apply migrations before starting")
	f.BoolVar(&o.exitWhenEmpty, "exit-when-empty", false, "exit 0 once the outbox is empty (batch jobs, benchmarks)")
	f.StringVar(&o.onConfChange, "on-config-change", relay.ConfigChangeWait, "what a relay does while live relays of its route run another configuration of it (topics, where the sink delivers, format, on-dead-letter, fan-out): "+
		relay.ConfigChangeWait+" (take no lane, /readyz 503 naming them, until they are gone: a rolling change), "+
		relay.ConfigChangeFail+" (exit 2) or "+relay.ConfigChangeAllow+" (share the route's lanes with them)")
	f.BoolVar(&o.allowConfChange, "allow-config-change", false, "same as --on-config-change "+relay.ConfigChangeAllow+": share a route's lanes with live relays that run another configuration of it during a rolling change")
	f.StringVar(&o.id, "id", "", "relay id shown in status (default hostname-pid-random)")
	f.StringVar(&o.producer, "producer", "", "name of this outbox in every message's outbox-producer header, so that consumers of several outboxes (the inbox) order each key per producer; printable ASCII, at most 255 bytes; --producer="+relay.ProducerNone+" sends none (default: the cluster's system identifier, the database and the schema, e.g. 7713292241186691262/app/outbox)")
	f.BoolVar(&o.isolateRoutes, "isolate-routes", false, "feed every route of the routes table from the fan-out router's copies, so that a route's backlog (its destination down) never slows the other routes' claims; costs a copy of every message")
	f.StringVar(&o.readiness, "readiness", readyAnyRoute, "with a routes table, when /readyz fails: "+readyAnyRoute+" (only when no route's destination is up; one route down answers 200 degraded) or "+readyEveryRoute+" (as soon as one route's destination is down)")
	f.BoolVar(&o.archive, "archive", false, "keep delivered messages in the archive table (daily partitions) for outbox-relay replay")
	f.DurationVar(&o.archiveRetain, "archive-retention", 7*24*time.Hour, "how long archived messages are kept (whole days)")
	f.DurationVar(&o.connectTimeout, "connect-timeout", 30*time.Second, "how long to wait for the database at start-up before exiting (and for a broker that refuses the sink's credentials)")
	f.StringVar(&o.format, "format", "raw", "message format: raw, cloudevents (binary mode, headers per sink binding) or debezium (outbox event router compatible)")
	f.StringVar(&o.ceSource, "cloudevents-source", format.DefaultSource, "CloudEvents source attribute (a URI reference naming your service)")
	f.StringVar(&o.ceAMQPPrefix, "cloudevents-amqp-prefix", format.AMQPPrefixUnderscore, "CloudEvents AMQP property prefix: cloudEvents_ or cloudEvents:")
	f.StringVar(&o.adminAddr, "admin-addr", ":9090", "listen address for /metrics, /livez, /readyz and the operator console (/ui, /api/v1) (empty disables)")
	f.StringVar(&o.adminTokenFile, "admin-token-file", "", "file of the console's bearer tokens, one name:token a line (name:token:read for a read-only one), mode 0600: replay, purge and the dead letters need one; without it replay and purge are disabled and the dead letters are not served (see --admin-open-payloads)")
	f.BoolVar(&o.pprof, "pprof", false, "also serve the Go runtime's profiles (net/http/pprof) under /debug/pprof/ on the admin listener, without authentication: for profiling, not for production")
	f.BoolVar(&o.adminReadToken, "admin-read-token", false, "every read of the console needs a token of --admin-token-file, the status and the UI's other pages too, not only the dead letters")
	f.BoolVar(&o.adminOpenPay, "admin-open-payloads", false, "serve the dead letters (their payloads and headers, in /api/v1 and /ui) to anyone who reaches --admin-addr, without a token: only for a listener that trusted hosts alone reach (default: they need a token of --admin-token-file, and without one they are refused)")
	f.DurationVar(&o.consoleSample, "console-sample-interval", 30*time.Second, "how often the console samples the backlog per topic for the overview's one-hour charts")
	f.DurationVar(&o.consoleFailing, "console-failing-after", console.DefaultFailingAfter, "how long messages of a topic or route may have been failing before the console's overview shows a banner")
	f.DurationVar(&o.metricsInterval, "metrics-interval", 15*time.Second, "how often the backlog gauges are refreshed from the database (a count of the outbox: less often when a count takes more than a twentieth of it)")
	return cmd
}

// check reports the first flag of o whose value is a mistake on the
// command line (zero means "default" in relay.Config).
func (o runOptions) check() error {
	// Zero means "default" in relay.Config; on the command line it is a
	// mistake.
	for name, v := range map[string]int64{
		"workers": int64(o.workers), "pipeline": int64(o.pipeline), "batch-size": int64(o.batchSize), "max-attempts": int64(o.maxAttempts),
		"poll-interval": int64(o.pollInterval), "watch-interval": int64(o.watchInterval), "publish-timeout": int64(o.publishTimeout),
		"retry-max": int64(o.retryMax), "lease-ttl": int64(o.leaseTTL), "metrics-interval": int64(o.metricsInterval),
		"connect-timeout": int64(o.connectTimeout), "batch-bytes": o.batchBytes, "max-message-bytes": o.maxMessageBytes, "console-sample-interval": int64(o.consoleSample),
		"console-failing-after": int64(o.consoleFailing),
	} {
		if v <= 0 {
			return usagef("outbox: %s: must be positive", name)
		}
	}
	if o.heartbeat < 0 || o.drainTimeout < 0 || o.retryInitial < 0 {
		return usagef("outbox: heartbeat, drain-timeout and retry-initial must not be negative")
	}
	if o.pprof && o.adminAddr == "" {
		return usagef("outbox: pprof: needs the admin listener (--admin-addr)")
	}
	if o.maxConns < 0 {
		return usagef("outbox: max-conns: must not be negative (0: what the configuration needs, plus one)")
	}
	if o.sourceBatches < 1 {
		return usagef("outbox: source-batches: must be 1 or more, got %d", o.sourceBatches)
	}
	return nil
}

// relayConfig is the relay configuration the flags of o give, with its
// defaults, validated.
func (o runOptions) relayConfig(g *globals) (relay.Config, error) {
	base := relay.Config{
		ID:                  o.id,
		Producer:            o.producer,
		Schema:              g.schema,
		Workers:             o.workers,
		Pipeline:            o.pipeline,
		BatchSize:           o.batchSize,
		BatchBytes:          o.batchBytes,
		MaxMessageBytes:     o.maxMessageBytes,
		PollInterval:        o.pollInterval,
		Wakeup:              o.wakeup,
		WatchInterval:       o.watchInterval,
		PublishTimeout:      o.publishTimeout,
		MaxAttempts:         o.maxAttempts,
		RateLimit:           o.rateLimit,
		RateBurst:           o.rateBurst,
		OnDeadLetter:        o.onDeadLetter,
		RetryInitial:        o.retryInitial,
		RetryMax:            o.retryMax,
		RetryMultiplier:     o.retryMultiplier,
		RetryJitter:         o.retryJitter,
		LeaseTTL:            o.leaseTTL,
		Heartbeat:           o.heartbeat,
		DrainTimeout:        o.drainTimeout,
		DisableFastFailover: o.noFastFailover,
		Archive:             o.archive,
		ArchiveRetention:    o.archiveRetain,
		ConnectTimeout:      o.connectTimeout,
		OnConfigChange:      o.onConfChange,
		Version:             version(),
		Logger:              g.log,
	}
	if o.retryJitter == 0 {
		base.RetryJitter = -1 // an explicit 0 means no jitter
	}
	if o.allowConfChange {
		if o.onConfChange != relay.ConfigChangeWait && o.onConfChange != relay.ConfigChangeAllow {
			return relay.Config{}, usagef("outbox: allow-config-change: means --on-config-change %s, but --on-config-change is %q: give one of them", relay.ConfigChangeAllow, o.onConfChange)
		}
		base.OnConfigChange = relay.ConfigChangeAllow
	}
	base = base.WithDefaults()
	if err := base.Validate(); err != nil {
		return relay.Config{}, &usageError{err}
	}
	return base, nil
}

// run runs the relays of one database, or of a sources list.
func (g *globals) run(parent context.Context, o runOptions) error {
	if g.sourceName == "" && len(g.sources) > 0 {
		return g.runSources(parent, o)
	}
	if g.sourceName != "" && o.producer == "" {
		o.producer = g.sources[0].producer // --source: that source's
	}
	return g.runOne(parent, o)
}

// runOne runs the relays of one database.
func (g *globals) runOne(parent context.Context, o runOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	base, err := o.relayConfig(g)
	if err != nil {
		return err
	}
	routes, planned, single, err := planRoutes(g, o, base)
	if err != nil {
		return err
	}
	maxConns, workers, err := connBudget(planned, o.maxConns)
	if err != nil {
		return err
	}
	tokens, err := loadTokens(o)
	if err != nil {
		return err
	}
	if err := g.requireDatabase(); err != nil {
		return err
	}
	password, passwordFrom, err := g.databasePassword(parent, g.databaseURL)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	closing := stopDeadline(ctx, parent, planned)
	opened, closeSinks, err := g.openSinks(routes, closing)
	defer closeSinks()
	if err != nil {
		return err
	}

	pool, err := g.openPool(ctx, parent, o, g.schema, relay.PoolConfig{
		URL: g.databaseURL, Workers: workers, MaxConns: maxConns, PublishTimeout: base.PublishTimeout, SynchronousCommit: o.syncCommit,
		Password: password,
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	reg, otelOn, flushOTel, err := g.telemetry(ctx, closing)
	if err != nil {
		return err
	}
	defer flushOTel()
	metrics := relayprom.New(reg, version())
	reg.MustRegister(relayprom.NewPoolCollector(pool))
	hooks, err := routeHooks(routes, planned, metrics, otelOn.Traces)
	if err != nil {
		return err
	}
	relays, err := newRelays(pool, routes, opened, base, single, o.setFlags(), hooks)
	if err != nil {
		return &usageError{err}
	}
	reg.MustRegister(relayprom.NewHealthCollector(relays, 2*time.Second), relayprom.NewStatsCollector(relaysOf(relays)))
	for _, cfg := range planned {
		g.log.Info("relaying", "route", cfg.Route, "topics", cfg.Topics, "sink", describe(routes, cfg.Route).sinkName)
	}
	if o.adminAddr != "" {
		stopAdmin, err := g.serveAdmin(parent, o, adminParts{pool: pool, base: base, tokens: tokens, routes: routes,
			planned: planned, reg: reg, relays: relays}, closing)
		defer stopAdmin()
		if err != nil {
			return err
		}
	}
	if o.adminAddr != "" || otelOn.Metrics {
		// The backlog gauges count the outbox (0.85 s of database time
		// on a 1M backlog here): only when something reads them.
		defer g.watchOutbox(parent, pool, g.schema, metrics, o.metricsInterval, g.log)()
	}
	// Each relay says "relay running" once it has reached the database and
	// checked the schema; nothing here has connected yet.
	starting := []any{"database", redactURL(g.databaseURL), "routes", len(planned), "max_conns", maxConns}
	if passwordFrom != "" {
		starting = append(starting, "password_from", passwordFrom)
	}
	g.log.Info("starting", starting...)
	if o.exitWhenEmpty {
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go g.cancelWhenEmpty(runCtx, []outboxAt{{pool, g.schema}}, cancel)
		ctx = runCtx
	}
	if err := relays.Run(ctx); err != nil {
		if errors.Is(err, relay.ErrConfig) {
			return &usageError{err}
		}
		return err
	}
	return nil
}

// openPool connects the relay's pool (on parent: it outlives the signal
// that starts the drain) and, with --migrate, migrates the schema (on
// ctx).
func (g *globals) openPool(ctx, parent context.Context, o runOptions, schema string, pc relay.PoolConfig) (*pgxpool.Pool, error) {
	pool, err := relay.NewPool(parent, pc)
	if err != nil {
		return nil, err
	}
	if o.migrate {
		if _, err := migrations.Apply(ctx, pool, schema); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// telemetry builds the metrics registry that /metrics serves and installs
// OpenTelemetry from the OTEL_* variables, which exports that registry's
// metrics through the Prometheus bridge: one definition of each metric,
// the same names on /metrics and over OTLP. flush is to be deferred
// before the relays and the backlog watch start, so that it runs after
// they stopped and the last export holds their final counts.
func (g *globals) telemetry(ctx context.Context, closing func(time.Duration) (context.Context, context.CancelFunc)) (
	_ *prometheus.Registry, _ relayotel.Signals, flush func(), _ error,
) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	shutdown, on, err := relayotel.Setup(ctx, relayotel.WithServiceVersion(version()), relayotel.WithLogger(g.log),
		relayotel.WithMetricProducer(otelprom.NewMetricProducer(otelprom.WithGatherer(reg))), relayotel.WithConsoleWriter(g.stderr))
	if err != nil {
		return nil, relayotel.Signals{}, nil, &usageError{err}
	}
	flush = func() {
		cctx, cancel := closing(5 * time.Second)
		defer cancel()
		if err := shutdown(cctx); err != nil {
			g.log.Warn("opentelemetry: flushing at exit", "error", err)
		}
	}
	return reg, on, flush, nil
}

// planRoutes reads the routes (the config file's table, or --sink for a
// single relay: single) and plans each route's relay configuration.
func planRoutes(g *globals, o runOptions, base relay.Config) (routes []route, planned []relay.Config, single bool, err error) {
	routes, err = parseRoutes(g, base)
	if err != nil {
		return nil, nil, false, err
	}
	switch {
	case routes != nil && o.sink != "":
		return nil, nil, false, usagef("outbox: sink: give either --sink or a routes table in the config file, not both")
	case o.readiness != readyAnyRoute && o.readiness != readyEveryRoute:
		return nil, nil, false, usagef("outbox: readiness: %q must be %s or %s", o.readiness, readyAnyRoute, readyEveryRoute)
	case routes == nil && o.isolateRoutes:
		return nil, nil, false, usagef("outbox: isolate-routes: isolates the routes of a routes table in the config file; with --sink there is one route")
	case routes == nil:
		open, name, err := parseSink(o.sink, g)
		if err != nil {
			return nil, nil, false, err
		}
		routes = []route{{cfg: base, open: open, sinkName: name, label: sinkLabel(o.sink), scheme: sinkScheme(o.sink)}}
		single = true
	}
	for i := range routes {
		// What status and the route's configuration summary say of the
		// sink, redacted; the fingerprint takes the sink's target from the
		// opened sink (see relay.Config.Destination).
		routes[i].cfg.Destination = routes[i].sinkName
	}
	for i := range routes {
		if err := routes[i].applyFormat(o); err != nil {
			return nil, nil, false, err
		}
	}
	planned = []relay.Config{base}
	if !single {
		if planned, err = setConfig(routes, nil, base, o.setFlags(), nil).Plan(); err != nil {
			return nil, nil, false, &usageError{err}
		}
	}
	return routes, planned, single, nil
}

// openSinks opens the sink of each route; closeAll closes those opened
// (it is also the one to call when openSinks fails).
func (g *globals) openSinks(routes []route, closing func(time.Duration) (context.Context, context.CancelFunc)) (opened []sinks.Sink, closeAll func(), err error) {
	opened = make([]sinks.Sink, 0, len(routes))
	closeAll = func() {
		cctx, cancel := closing(10 * time.Second)
		defer cancel()
		for _, s := range opened {
			if err := s.Close(cctx); err != nil {
				g.log.Warn("closing sink", "error", err)
			}
		}
	}
	for _, rt := range routes {
		s, err := rt.open()
		if err != nil {
			return opened, closeAll, fmt.Errorf("outbox: sink %s: %w", rt.sinkName, err)
		}
		opened = append(opened, s)
	}
	return opened, closeAll, nil
}

// adminParts are what the admin listener serves.
type adminParts struct {
	pool    *pgxpool.Pool
	base    relay.Config
	tokens  *console.Tokens
	routes  []route
	planned []relay.Config
	reg     *prometheus.Registry
	relays  adminhttp.Checker
	// fleet holds the sources of a run with a sources list (pool is
	// then nil).
	fleet *fleet
}

// console builds the operator console of p and the samplers behind its
// charts.
func (p adminParts) console(g *globals, o runOptions) (http.Handler, []*console.Sampler, error) {
	if p.fleet != nil {
		h, err := p.fleet.serveConsole()
		return h, nil, err // the fleet runs each source's sampler
	}
	con, sampler, err := newConsole(g, p.pool, p.base, o, p.tokens, p.routes, p.planned)
	if err != nil {
		return nil, nil, err
	}
	return con, []*console.Sampler{sampler}, nil
}

// serveAdmin starts the admin listener (metrics, health, the console)
// and the console's sampler. stop ends them, in the reverse order; it is
// also the one to call when serveAdmin fails.
func (g *globals) serveAdmin(parent context.Context, o runOptions, p adminParts, closing func(time.Duration) (context.Context, context.CancelFunc)) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	con, samplers, err := p.console(g, o)
	if err != nil {
		return stop, err
	}
	sampleCtx, stopSampling := context.WithCancel(parent)
	var sampled sync.WaitGroup
	for _, sampler := range samplers {
		sampled.Add(1)
		go func() { defer sampled.Done(); sampler.Run(sampleCtx) }()
	}
	stops = append(stops, func() { stopSampling(); sampled.Wait() })
	var opts []adminhttp.Option
	if o.pprof {
		opts = append(opts, adminhttp.WithPprof())
	}
	srv, err := adminhttp.Start(o.adminAddr, p.reg, p.relays, g.log, con, opts...)
	if err != nil {
		return stop, &usageError{err}
	}
	g.log.Info("admin listener", "addr", srv.Addr())
	if o.adminOpenPay {
		g.log.Warn("the console serves dead letters' payloads and headers without a token (--admin-open-payloads)", "addr", srv.Addr())
	}
	stops = append(stops, func() {
		cctx, cancel := closing(5 * time.Second)
		defer cancel()
		_ = srv.Close(cctx)
	})
	return stop, nil
}

// watchOutbox keeps the backlog gauges fresh until stop is called.
func (g *globals) watchOutbox(parent context.Context, pool *pgxpool.Pool, schema string, metrics *relayprom.Metrics, every time.Duration, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		metrics.WatchOutbox(ctx, pool, schema, every, log)
	}()
	return func() { cancel(); <-done }
}

// closeGrace is how long past the drain timeout a stop may take to close
// the sinks, the admin listener and the OpenTelemetry exporters once the drain
// used all of it: enough for a clean close, bounded whatever a sink does.
const closeGrace = time.Second

// stopDeadline returns the contexts the closes of a run get: each bounded
// by its own limit and, once ctx ends (the signal), by the longest drain
// timeout of the planned relays plus closeGrace from then, so that the
// process exits within that bound whatever a sink does (a sink that cannot
// connect, a broker that stopped reading).
func stopDeadline(ctx, parent context.Context, planned []relay.Config) func(time.Duration) (context.Context, context.CancelFunc) {
	var drain time.Duration
	for _, c := range planned {
		drain = max(drain, c.WithDefaults().DrainTimeout)
	}
	var stopBy atomic.Int64 // unix nanoseconds; 0 until ctx ends
	context.AfterFunc(ctx, func() { stopBy.Store(time.Now().Add(drain + closeGrace).UnixNano()) })
	return func(limit time.Duration) (context.Context, context.CancelFunc) {
		deadline := time.Now().Add(limit)
		if by := stopBy.Load(); by != 0 {
			deadline = time.Unix(0, min(by, deadline.UnixNano()))
		}
		return context.WithDeadline(context.WithoutCancel(parent), deadline)
	}
}

// connBudget returns the process's connection cap (--max-conns, or by
// default what the planned relays need with every worker's pipeline full,
// plus one for health checks and metrics) and its workers over all
// relays. A cap below the need is a
// usage error rather than fewer workers than configured: a worker without
// a connection of its own would make its relay hand its lanes away.
func connBudget(planned []relay.Config, maxConns int) (int, int, error) {
	workers := 0
	for _, c := range planned {
		workers += c.Workers
	}
	need := relay.Conns(planned...)
	if maxConns == 0 {
		return need + relay.PipelineConns(planned...) + 1, workers, nil
	}
	if maxConns < need {
		return 0, 0, usagef("outbox: max-conns: %d is below the %d connections this configuration holds (per route, one per worker and one for the lane lease; one LISTEN connection): raise max-conns or lower workers", maxConns, need)
	}
	return maxConns, workers, nil
}

// outboxAt is an outbox: a pool to its database and its schema.
type outboxAt struct {
	pool   *pgxpool.Pool
	schema string
}

// cancelWhenEmpty cancels the run once every outbox holds no message.
func (g *globals) cancelWhenEmpty(ctx context.Context, outboxes []outboxAt, cancel func()) {
	schemas := make([]store.Schema, len(outboxes))
	for i, ob := range outboxes {
		s, err := store.NewSchema(ob.schema)
		if err != nil {
			return // the relays refuse the schema and end the run
		}
		schemas[i] = s
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g.allEmpty(ctx, outboxes, schemas) {
			g.log.Info("outbox is empty; exiting")
			cancel()
			return
		}
	}
}

// allEmpty reports whether every outbox answered that it is empty.
func (g *globals) allEmpty(ctx context.Context, outboxes []outboxAt, schemas []store.Schema) bool {
	for i, ob := range outboxes {
		if empty, err := schemas[i].Empty(ctx, ob.pool); err != nil || !empty {
			return false
		}
	}
	return true
}

func newHealthcheck(g *globals) *cobra.Command {
	var addr, path string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the relay on this host is ready (for images without a shell)",
		Long: `Asks the admin listener of a relay running on this host (--admin-addr) for
/readyz and exits 0 when it answers 200, 1 otherwise. Use it as a Docker
HEALTHCHECK in the distroless image.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := adminhttp.Probe(ctx, addr, path); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "ok")
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "admin-addr", ":9090", "the relay's admin listener")
	cmd.Flags().StringVar(&path, "path", "/readyz", "endpoint to check: /readyz or /livez")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for an answer")
	return cmd
}

func newVersion(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit it was built from and the schema version it needs",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v, commit := versionInfo()
			fmt.Fprintf(g.stdout, "outbox-relay %s (commit %s, schema version %d, %s)\n", v, commit, migrations.Latest(), goVersion())
			return nil
		},
	}
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "go"
}

// exitCodeFor is exported for tests through Main.
var _ = os.Exit
