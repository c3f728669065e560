package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/internal/archive"
	"github.com/outbox-relay/outbox-relay/relay/internal/lease"
	"github.com/outbox-relay/outbox-relay/relay/internal/schemacheck"
	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/settle"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
	"github.com/outbox-relay/outbox-relay/relay/internal/wake"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Relay moves messages from the outbox to a sink.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	sink sinks.Sink
	log  *slog.Logger

	schema store.Schema
	// src is where the workers claim from, chosen by New.
	src *source
	// leftover: this relay reads the outbox, but fan-out copies made for
	// its route under an earlier configuration are still waiting; it
	// delivers them (from leftoverSrc) before it reads the outbox again,
	// so that they are not stranded and each key stays in order.
	leftover    atomic.Bool
	leftoverSrc *source
	// lease keeps the relay's share of the lanes, and owns the lane
	// state (see package lease).
	lease *lease.Leaser
	// waker is the process's wake-up (its own, or its Set's), which hears
	// the ids each claim returned (see claimed); nil: none, or not
	// started. Set before the workers start.
	waker *wake.Waker
	// brk is the route's outage breaker (see breaker).
	brk *breaker
	// dests holds the outages of the sink's destinations when it has
	// several (see destinations); nil otherwise.
	dests *destinations
	// limiter bounds the route's deliveries (Config.RateLimit); nil: no
	// limit.
	limiter *rate.Limiter
	// rateCause is what the route's strain says it waits for when the
	// limiter makes it wait.
	rateCause error
	// strain records the route's waits and failures (see strain).
	strain *strain

	// workers are the claim loops, each with its own state.
	workers []*worker
	// laneLimit is the most messages a claim takes from one lane: the
	// batch size, or an eighth of it for a sink that sends a key's
	// messages one round trip after another (sinks.KeySerial), whose
	// batches go faster the more keys they span.
	laneLimit int
	// pooled: the pool's sessions go through a transaction-pooling proxy
	// (found at Run's start; see store.Pooled). claimSettings is then
	// what each claim's transaction sets in place of session settings.
	pooled        bool
	claimSettings string
	inFlight      atomic.Int64 // claimed messages not yet settled
	// rules decide each batch's settlement; settler carries it out.
	rules    settle.Rules
	settler  *settle.Settler
	draining atomic.Bool
	// schemaErr is set while the schema needs a newer relay (it was
	// migrated under a running relay): workers claim nothing.
	schemaErr atomic.Pointer[error]
	// abort stops Run with a cause (ConfigChangeFail); set by Run.
	abort context.CancelCauseFunc
	// producer names the outbox in the messages' headers; set by Run
	// before the workers start (see resolveProducer).
	producer producer

	stats totals
	// running is closed once Run has passed the start-up checks and
	// started the lease.
	running chan struct{}
}

// totals are the relay's running totals, read with Relay.Stats.
type totals struct {
	Claimed, Delivered, Retried, DeadLettered, Batches, CommitFailures atomic.Int64
	// Claims counts claim transactions, empty ones included.
	Claims atomic.Int64
	// LaneClaims counts the claims that visited only the lanes a wake-up
	// named (the others visited every lane of their worker).
	LaneClaims atomic.Int64
	// EmptyClaims counts the claims that found nothing.
	EmptyClaims atomic.Int64
	// Wakeups counts the wake-ups the relay received.
	Wakeups atomic.Int64
}

// StatsSnapshot is a copy of a relay's running totals (Relay.Stats).
type StatsSnapshot struct {
	Claimed, Delivered, Retried, DeadLettered, Batches, CommitFailures int64
	// Claims counts claim transactions, empty ones (EmptyClaims)
	// included; LaneClaims visited only the lanes a wake-up named.
	Claims, LaneClaims, EmptyClaims int64
	// Wakeups counts the wake-ups the relay received.
	Wakeups int64
}

// New returns a relay that reads the outbox through pool (see NewPool and
// Conns) and publishes to sink.
func New(pool *pgxpool.Pool, sink sinks.Sink, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || (sink == nil && len(cfg.fanOut) == 0) {
		return nil, errors.New("outbox: relay: pool and sink are required")
	}
	// What this relay holds itself (a shared LISTEN is the caller's: see
	// Conns for a whole process).
	need, what := cfg.Workers+2, "one each, the lane lease and LISTEN"
	if cfg.sharedListener {
		need, what = cfg.Workers+1, "one each and the lane lease"
	}
	if max := int(pool.Config().MaxConns); max < need {
		return nil, fmt.Errorf("outbox: max-conns: %d workers need a pool of at least %d connections (%s), have %d", cfg.Workers, need, what, max)
	}
	schema, err := store.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if signalsForTests && cfg.sig == nil {
		cfg.sig = testsig.New()
	}
	r := &Relay{
		running:   make(chan struct{}),
		cfg:       cfg,
		pool:      pool,
		sink:      sink,
		schema:    schema,
		log:       cfg.Logger.With("relay_id", cfg.ID),
		laneLimit: cfg.BatchSize,
		rules:     settle.Rules{Retry: cfg.retryPolicy(), Hold: cfg.OnDeadLetter == OnDeadLetterHold},
	}
	r.strain = newStrain(cfg.Heartbeat)
	if r.settler, err = settle.New(settle.Config{Log: r.log, Archive: cfg.Archive, Park: cfg.RetryMax}); err != nil {
		return nil, err
	}
	if sinks.IsKeySerial(sink) {
		lanes := keySerialLanes
		if b, ok := sinks.As[sinks.BatchLanes](sink); ok && b.BatchLanes() > 0 {
			lanes = b.BatchLanes()
		}
		r.laneLimit = max(1, cfg.BatchSize/lanes)
	}
	r.workers = make([]*worker, cfg.Workers)
	for i := range r.workers {
		r.workers[i] = newWorker(r, i)
	}
	r.src, r.leftoverSrc = newSources(schema, cfg)
	if cfg.Route != "" {
		r.log = r.log.With("route", cfg.Route)
	}
	confHash, confSummary := fingerprint(cfg, sink)
	r.lease, err = lease.New(lease.Config{
		Pool: pool, Leases: store.NewLeases(schema, cfg.ID, cfg.Route), Logger: r.log, Hooks: cfg.Hooks, Signals: cfg.sig,
		Route: cfg.Route, LeaseTTL: cfg.LeaseTTL, Heartbeat: cfg.Heartbeat, FastFailover: !cfg.DisableFastFailover,
		Version: cfg.Version, OnConfigChange: configPolicies[cfg.OnConfigChange], ConfigHash: confHash, ConfigSummary: confSummary,
		ErrConflict: ErrConfig, Starved: r.starved, InFlight: r.inFlight.Load, WakeAll: r.wakeAll, Report: r.leaseReport,
	})
	if err != nil {
		return nil, err
	}
	r.brk = newBreaker(cfg.Workers, r.log, cfg.Hooks, cfg.sig, r.wakeWorker)
	r.dests = newDestinations(sink, r.log)
	if cfg.RateLimit > 0 {
		r.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.RateBurst)
		r.rateCause = fmt.Errorf("rate limit %g/s (burst %d)", cfg.RateLimit, cfg.RateBurst)
	}
	return r, nil
}

// State returns the route's delivery state: whether its destination is
// down as a whole (see Hooks.Outage), whether it waits for a rate limit,
// whether its messages fail (RouteState.Health says which of these
// wins). Each heartbeat records it in the relays table (see
// operator.Status) and hands it to Hooks.RouteState.
func (r *Relay) State() RouteState {
	st := r.brk.State()
	r.strain.fill(&st)
	if r.dests != nil {
		r.dests.fill(&st)
	}
	return st
}

// leaseReport is the route's state as each heartbeat of the leaser
// records it (see State), which it also hands to Hooks.RouteState and
// announces to tests.
func (r *Relay) leaseReport() lease.Report {
	st := r.State()
	var rep lease.Report
	if st.Open {
		rep.DownSince, rep.DownCause, rep.DownProbes = st.Since, st.Cause, st.Probes
	}
	if st.Limited {
		rep.LimitedSince, rep.LimitCause = st.LimitedSince, st.LimitCause
	}
	if st.Failing {
		rep.FailingSince, rep.LastError = st.FailingSince, st.LastError
	}
	r.cfg.Hooks.RouteState(st)
	r.cfg.sig.Emit(testsig.RouteState, healthLevel(st.Health()))
	return rep
}

// Route returns the relay's route ("" outside a Set).
func (r *Relay) Route() string { return r.cfg.Route }

// OwnedLanes returns how many lanes this relay holds right now.
func (r *Relay) OwnedLanes() int { return r.lease.OwnedCount() }

// Stats returns running totals.
func (r *Relay) Stats() StatsSnapshot {
	return StatsSnapshot{
		Claimed: r.stats.Claimed.Load(), Delivered: r.stats.Delivered.Load(),
		Retried: r.stats.Retried.Load(), DeadLettered: r.stats.DeadLettered.Load(),
		Batches: r.stats.Batches.Load(), CommitFailures: r.stats.CommitFailures.Load(),
		Claims: r.stats.Claims.Load(), LaneClaims: r.stats.LaneClaims.Load(),
		EmptyClaims: r.stats.EmptyClaims.Load(), Wakeups: r.stats.Wakeups.Load(),
	}
}

// Run relays messages until ctx is cancelled, then drains: it stops
// claiming, lets in-flight batches finish (rolling them back after
// DrainTimeout), hands its lanes back and returns nil. It does not close
// the sink or the pool. It refuses a database whose server_encoding is not
// UTF8 (an error wrapping migrations.ErrServerEncoding).
func (r *Relay) Run(ctx context.Context) (err error) {
	// The leaser stops the relay with a cause when it must not run (see
	// ConfigChangeFail): Run then drains as on a cancellation and returns
	// the cause.
	ctx, r.abort = context.WithCancelCause(ctx)
	defer func() {
		if cause := context.Cause(ctx); err == nil && errors.Is(cause, ErrConfig) {
			err = cause
		}
		r.abort(nil)
	}()
	v, err := r.preflight(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing to drain
		}
		return err
	}
	hard, stopDrain := r.drainOnCancel(ctx)
	defer stopDrain()

	if err := r.findLeftover(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if r.cfg.Archive {
		keeper, err := archive.New(archive.Config{Pool: r.pool, Schema: r.schema, Retention: r.cfg.ArchiveRetention, Log: r.log})
		if err != nil {
			return err
		}
		// Partitions must exist before the first delivery is archived.
		if err := keeper.Maintain(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := keeper.Start(ctx); err != nil {
			return err
		}
		defer keeper.Stop()
	}
	r.log.Info("relay running", "schema", r.cfg.Schema, "schema_version", v, "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "lane_limit", r.laneLimit, "batch_bytes", r.cfg.BatchBytes, "archive", r.cfg.Archive, "producer", r.producer.name)
	stopWatch, err := watchSchema(ctx, r.pool, r.cfg, r.log, func(err error) {
		if err != nil {
			r.schemaErr.Store(&err)
			return
		}
		r.schemaErr.Store(nil)
		r.wakeAll()
	})
	if err != nil {
		return err
	}
	defer stopWatch()
	r.lease.Prepare(r.pooled, r.abort)
	if err := r.lease.Start(ctx); err != nil {
		r.abort(err) // ends what Run started so far
		return err
	}
	close(r.running)
	r.cfg.sig.Emit(testsig.Started, 0)
	stopListen := func() {}
	if !r.cfg.sharedListener {
		cfg := r.cfg
		cfg.Logger = r.log
		r.waker, stopListen = listen(ctx, r.pool, cfg, r.wakeSet, r.lease.MembersNotified)
	}

	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, hard)
		}()
	}
	wg.Wait()
	stopListen()
	r.lease.Stop()
	// Hand the lanes to the other relays now rather than after LeaseTTL.
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r.lease.Release(relCtx)
	s := r.Stats()
	r.log.Info("relay stopped", "delivered", s.Delivered, "retried", s.Retried, "dead_lettered", s.DeadLettered)
	r.cfg.sig.Emit(testsig.Stopped, 0)
	return nil
}

// preflight checks, before the relay starts, that it may run here: the
// server's encoding, the schema's version, the kind of sessions the pool
// gives, and the sink's own start check; and it reads the producer's name
// (see Config.Producer). It returns the schema's version.
func (r *Relay) preflight(ctx context.Context) (int, error) {
	v, relayMin, err := r.schemaVersion(ctx)
	if err != nil {
		return 0, err
	}
	// Before the version: a schema that migrate refuses to create here
	// would otherwise be reported as missing.
	if err := r.atStart(ctx, func() error { return migrations.CheckEncoding(ctx, r.pool) }, migrations.ErrServerEncoding); err != nil {
		return 0, err
	}
	if err := schemacheck.RunsOn(r.cfg.Schema, v, relayMin); err != nil {
		return 0, err
	}
	if v > migrations.Latest() {
		r.log.Info("schema is newer than this relay, and compatible with it", "schema_version", v, "relay_knows", migrations.Latest())
	}
	if err := r.checkSessions(ctx); err != nil {
		return 0, err
	}
	err = r.atStart(ctx, func() error {
		var err error
		r.producer, err = resolveProducer(ctx, r.pool, r.cfg.Producer, r.cfg.Schema, r.cfg.Router())
		return err
	})
	if err != nil {
		return 0, err
	}
	if sc, ok := sinks.As[sinks.StartChecker](r.sink); ok {
		// Under a payload format too: the check is the sink's underneath.
		cctx, cancel := context.WithTimeout(ctx, r.cfg.ConnectTimeout)
		err := sc.CheckStart(cctx)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("outbox: sink: %w", err)
		}
	}
	return v, nil
}

// drainOnCancel returns the context of the relay's in-flight work (hard):
// once ctx ends, the relay drains, and hard ends DrainTimeout later, so
// that in-flight work rolls back instead of holding the shutdown. stop
// ends hard and waits for the drain's announcement, so that nothing of
// this relay logs after Run returned (a caller may close the log then).
func (r *Relay) drainOnCancel(ctx context.Context) (hard context.Context, stop func()) {
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	drainStarted := make(chan struct{})
	stopDrainTimer := context.AfterFunc(ctx, func() {
		defer close(drainStarted)
		r.draining.Store(true)
		r.log.Info("draining: no new claims", "drain_timeout", r.cfg.DrainTimeout)
		time.AfterFunc(r.cfg.DrainTimeout, cancelHard)
	})
	return hard, func() {
		// AfterFunc runs its function in a goroutine of its own: once it
		// has started, wait for it.
		if !stopDrainTimer() {
			<-drainStarted
		}
		cancelHard()
	}
}

// checkSessions finds out whether the pool's sessions go through a
// transaction-pooling proxy. Through one, the relay keeps no session
// state: its claims set their timeouts in their own transactions, its
// wake-up neither listens nor takes the watcher's lock (see package wake), and
// its registration names no backend. A pool that prepares statements
// there is refused: the proxy hands them to other clients' backends
// (errors 42P05 and 26000, and batches settled twice).
func (r *Relay) checkSessions(ctx context.Context) error {
	var pooled bool
	var mode pgx.QueryExecMode
	err := r.atStart(ctx, func() (err error) {
		pooled, mode, err = r.sessionKind(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: database: %w", err)
	}
	if !pooled {
		return nil
	}
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
	default:
		return fmt.Errorf("%w: database-url: the connections go through a transaction-pooling proxy (PgBouncer or the like), where prepared statements reach other clients' sessions; add default_query_exec_mode=exec to the URL (relay.NewPool does so by itself)", ErrConfig)
	}
	r.pooled = true
	r.claimSettings = store.TxSettings{
		IdleInTransaction: r.cfg.PublishTimeout + 30*time.Second,
		Statement:         time.Minute,
		Lock:              30 * time.Second,
	}.SQL()
	r.log.Info("the database connections go through a transaction-pooling proxy: this relay keeps no session state (no LISTEN, no session locks or settings) and looks for new rows itself")
	return nil
}

// atStart runs check, a start-up check of the database, again while it
// fails for a reason that may pass (a connection lost, a session
// terminated, the server restarting), for up to ConnectTimeout, like the
// schema check; an error wrapping one of final returns at once.
func (r *Relay) atStart(ctx context.Context, check func() error, final ...error) error {
	deadline := time.Now().Add(r.cfg.ConnectTimeout)
	bo := service.ReconnectBackoff()
	for {
		err := check()
		if err == nil {
			return nil
		}
		for _, f := range final {
			if errors.Is(err, f) {
				return err
			}
		}
		d := bo.NextBackOff()
		if ctx.Err() != nil || time.Now().Add(d).After(deadline) {
			return err
		}
		r.log.Warn("database check at start failed; retrying", "error", err, "retry_in", d)
		service.Sleep(ctx, d)
	}
}

// sessionKind reports whether a connection of the pool goes through a
// transaction-pooling proxy, and the query mode of the pool's
// connections.
func (r *Relay) sessionKind(ctx context.Context) (bool, pgx.QueryExecMode, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, 0, err
	}
	defer conn.Release()
	pooled, err := store.Pooled(ctx, conn.Conn())
	if err != nil {
		// The session's state is unknown: the pool opens another.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		return false, 0, err
	}
	return pooled, conn.Conn().Config().DefaultQueryExecMode, nil
}

// findLeftover looks, for a relay that reads the outbox in a named route,
// for fan-out copies made for that route under an earlier configuration:
// they are delivered first (see Relay.leftover).
func (r *Relay) findLeftover(ctx context.Context) error {
	if r.cfg.deliveries || len(r.cfg.fanOut) > 0 || r.cfg.Route == "" {
		return nil
	}
	left, err := r.leftoverSrc.CopiesLeft(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("outbox: look for fan-out copies of route %q: %w", r.cfg.Route, err)
	}
	if left {
		r.leftover.Store(true)
		r.log.Warn("fan-out copies made for this route under an earlier configuration are waiting; delivering them before the outbox")
	}
	return nil
}

// schemaVersion reads the schema version, waiting up to ConnectTimeout for
// the database to be reachable: a relay started alongside its database (a
// sidecar, a compose stack) should not exit just because it came first.
func (r *Relay) schemaVersion(ctx context.Context) (version, relayMin int, err error) {
	deadline := time.Now().Add(r.cfg.ConnectTimeout)
	bo := service.ReconnectBackoff()
	for {
		version, relayMin, err = migrations.Requirement(ctx, r.pool, r.cfg.Schema)
		if err == nil {
			return version, relayMin, nil
		}
		if reason := refused(err); reason != "" {
			// Waiting cannot help: the server answered, and said no.
			if startupRefused(err) {
				return 0, 0, fmt.Errorf("%w: database-url: %s: %w", ErrConfig, reason, err)
			}
			return 0, 0, fmt.Errorf("outbox: database: %s: %w", reason, err)
		}
		d := bo.NextBackOff()
		if ctx.Err() != nil || time.Now().Add(d).After(deadline) {
			return 0, 0, err
		}
		r.log.Warn("database not reachable yet; retrying", "error", err, "retry_in", d)
		service.Sleep(ctx, d)
	}
}

// refused says why when err is the database server refusing the relay for
// good (the database does not exist, the password or the role is refused,
// pg_hba.conf has no entry for it), and "" for what may pass (the server
// is down or still starting, the network).
func refused(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	switch pe.Code {
	case "3D000":
		return "the database does not exist"
	case "28P01":
		return "password authentication failed"
	case "28000":
		return "the server refuses this role or host (the role does not exist, or pg_hba.conf has no entry for it)"
	case "08P01":
		if startupRefused(err) {
			return "a connection pooler in front of the server refuses the session settings this pool sends at start-up; open the pool with relay.NewPool, which sends none through a pooler, or remove them from the URL"
		}
	}
	return ""
}

// startupRefused reports whether err is a proxy refusing a start-up
// parameter (PgBouncer: "unsupported startup parameter").
func startupRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "08P01" && strings.Contains(pe.Message, "startup parameter")
}

// ErrConfig marks a configuration the relay cannot run with: waiting or
// retrying cannot help (the command line exits 2).
var ErrConfig = errors.New("outbox: configuration")
