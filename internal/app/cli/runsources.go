package cli

import (
	"context"
	"fmt"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// sourceIdleTime is how long a source's pool keeps a connection that no
// worker uses: a source holds its lease and wake-up sessions, and others
// only while it has work.
const sourceIdleTime = time.Minute

// sourceParts are what run builds for one source of a sources list.
type sourceParts struct {
	source
	pool    *pgxpool.Pool
	metrics *relayprom.Metrics
	admin   *operator.Admin
	sampler *console.Sampler // nil without the admin listener
	// registered are the source's collectors on the process's registry
	// besides metrics; stop ends what runs for it (gauges, sampler).
	registered []prometheus.Collector
	sreg       prometheus.Registerer
	stop       []func()
}

// fleet is the sources of a run and what each one holds, which a
// reload of the config file changes while the relays run.
type fleet struct {
	g       *globals
	o       runOptions
	parent  context.Context // the pools' and gauges' (they outlive the signal)
	reg     *prometheus.Registry
	pc      relay.PoolConfig
	routes  []route
	opened  []sinks.Sink
	base    relay.Config
	single  bool
	planned []relay.Config
	tracing bool
	gauges  bool // the backlog gauges are read (admin listener or OTLP)
	srcs    *relay.Sources
	con     *swapHandler // the console, rebuilt when the sources change; nil without one
	tokens  *console.Tokens
	mu      sync.Mutex
	parts   []*sourceParts
}

// runSources is run for a config file's sources list: one relay.Sources
// over a pool per source, the routes and their sinks shared, the
// metrics labelled by source. SIGHUP reads the file's sources list
// again and adds, removes or replaces sources to match it.
func (g *globals) runSources(parent context.Context, o runOptions) error {
	f, err := g.planFleet(parent, o)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	closing := stopDeadline(ctx, parent, f.planned)
	opened, closeSinks, err := g.openSinks(f.routes, closing)
	defer closeSinks()
	if err != nil {
		return err
	}
	f.opened = opened
	reg, otelOn, flushOTel, err := g.telemetry(ctx, closing)
	if err != nil {
		return err
	}
	defer flushOTel()
	relayprom.RegisterBuildInfo(reg, version())
	f.reg, f.tracing, f.gauges = reg, otelOn.Traces, o.adminAddr != "" || otelOn.Metrics
	defer f.closeAll()
	if err := f.start(ctx); err != nil {
		return err
	}
	for _, cfg := range f.planned {
		g.log.Info("relaying", "route", cfg.Route, "topics", cfg.Topics, "sink", describe(f.routes, cfg.Route).sinkName)
	}
	if o.adminAddr != "" {
		stopAdmin, err := g.serveAdmin(parent, o, adminParts{base: f.base, reg: reg, relays: f.srcs, fleet: f}, closing)
		defer stopAdmin()
		if err != nil {
			return err
		}
	}
	if o.exitWhenEmpty {
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go g.cancelWhenEmpty(runCtx, f.outboxes(), cancel)
		ctx = runCtx
	}
	defer f.reloadOnHangup(ctx)()
	g.log.Info("starting", "sources", len(f.parts), "routes", len(f.planned), "max_conns_per_source", f.pc.MaxConns, "reload", "SIGHUP")
	return f.srcs.Run(ctx)
}

// planFleet checks the run options and plans the routes every source
// runs.
func (g *globals) planFleet(parent context.Context, o runOptions) (*fleet, error) {
	if err := g.sourcesRunnable(o); err != nil {
		return nil, err
	}
	base, err := o.relayConfig(g)
	if err != nil {
		return nil, err
	}
	routes, planned, single, err := planRoutes(g, o, base)
	if err != nil {
		return nil, err
	}
	maxConns, workers, err := connBudget(planned, o.maxConns)
	if err != nil {
		return nil, err
	}
	tokens, err := loadTokens(o)
	if err != nil {
		return nil, err
	}
	return &fleet{g: g, o: o, parent: parent, routes: routes, base: base, single: single, planned: planned, tokens: tokens,
		pc: relay.PoolConfig{Workers: workers, MaxConns: maxConns, PublishTimeout: base.PublishTimeout,
			SynchronousCommit: o.syncCommit, IdleTime: sourceIdleTime}}, nil
}

// start opens every source of the file and builds the relay.Sources.
func (f *fleet) start(ctx context.Context) error {
	var list []relay.Source
	for _, s := range f.g.sources {
		p, err := f.open(ctx, s)
		if err != nil {
			return err
		}
		rs, err := f.relaySource(p)
		if err != nil {
			return err
		}
		list = append(list, rs)
	}
	srcs, err := relay.NewSources(relay.SourcesConfig{Sources: list, Logger: f.g.log, Batches: f.o.sourceBatches})
	if err != nil {
		return &usageError{err}
	}
	f.mu.Lock()
	f.srcs = srcs
	f.mu.Unlock()
	f.reg.MustRegister(relayprom.NewHealthCollector(srcs, 2*time.Second), relayprom.NewSourcesCollector(srcs.States))
	for _, p := range f.parts {
		f.watch(p)
	}
	return nil
}

// open opens s's pool (with --migrate, it migrates s's schema; a source
// whose database is down then starts like any other, and its relays
// report it) and registers its metrics; the fleet holds it from then on.
func (f *fleet) open(ctx context.Context, s source) (*sourceParts, error) {
	pc := f.pc
	pc.URL = s.url
	var err error
	if pc.Password, err = f.g.sourcePassword(ctx, s); err != nil {
		return nil, err
	}
	pool, err := relay.NewPool(f.parent, pc)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", s.name, err)
	}
	if f.o.migrate {
		if _, err := migrations.Apply(ctx, pool, s.schema); err != nil {
			f.g.log.Error("source not migrated", "source", s.name, "schema", s.schema, "error", err)
		}
	}
	admin, err := operator.New(pool, s.schema)
	if err != nil {
		pool.Close()
		return nil, &usageError{err}
	}
	p := &sourceParts{source: s, pool: pool, admin: admin,
		sreg: prometheus.WrapRegistererWith(prometheus.Labels{"source": s.name}, f.reg)}
	p.metrics = relayprom.NewSource(f.reg, s.name)
	p.registered = []prometheus.Collector{relayprom.NewPoolCollector(pool),
		relayprom.NewStatsCollector(func() []*relay.Relay { return f.relaysOf(s.name) })}
	for _, c := range p.registered {
		p.sreg.MustRegister(c)
	}
	f.mu.Lock()
	f.parts = append(f.parts, p)
	f.mu.Unlock()
	return p, nil
}

// watch starts what reads p's outbox besides its relays: the backlog
// gauges and the console's sampler.
func (f *fleet) watch(p *sourceParts) {
	log := f.g.log.With("source", p.name)
	if f.gauges {
		p.stop = append(p.stop, f.g.watchOutbox(f.parent, p.pool, p.schema, p.metrics, f.o.metricsInterval, log))
	}
	if f.o.adminAddr != "" {
		p.sampler = console.NewSampler(p.admin, f.o.consoleSample, log)
		ctx, cancel := context.WithCancel(f.parent)
		done := make(chan struct{})
		go func() { defer close(done); p.sampler.Run(ctx) }()
		p.stop = append(p.stop, func() { cancel(); <-done })
	}
}

// relaySource is p as a relay.Source: the routes (or the one --sink
// relay) on the shared opened sinks, with p's schema, producer and
// metrics.
func (f *fleet) relaySource(p *sourceParts) (relay.Source, error) {
	hooks, err := routeHooks(f.routes, f.planned, p.metrics, f.tracing)
	if err != nil {
		return relay.Source{}, err
	}
	src := relay.Source{Name: p.name, Pool: p.pool, Weight: p.weight}
	if f.single {
		src.Set = relay.SetConfig{Config: f.routes[0].cfg, Hooks: hooks}
		src.Set.Config.Schema, src.Set.Config.Producer = p.schema, p.producer
		src.Sink = f.opened[0]
		return src, nil
	}
	cfg := f.base
	cfg.Schema, cfg.Producer = p.schema, p.producer
	src.Set = setConfig(f.routes, f.opened, cfg, f.o.setFlags(), hooks)
	return src, nil
}

// close ends what f holds of p, once its relays stopped.
func (f *fleet) close(p *sourceParts) {
	for i := len(p.stop) - 1; i >= 0; i-- {
		p.stop[i]()
	}
	for _, c := range p.registered {
		p.sreg.Unregister(c)
	}
	p.metrics.Unregister()
	p.pool.Close()
}

// closeAll closes every source's parts (after Run returned).
func (f *fleet) closeAll() {
	f.mu.Lock()
	parts := f.parts
	f.parts = nil
	f.mu.Unlock()
	for _, p := range parts {
		f.close(p)
	}
}

// outboxes returns every source's outbox.
func (f *fleet) outboxes() []outboxAt {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]outboxAt, len(f.parts))
	for i, p := range f.parts {
		out[i] = outboxAt{p.pool, p.schema}
	}
	return out
}

// relaysOf returns the relays that source name runs now.
func (f *fleet) relaysOf(name string) []*relay.Relay {
	f.mu.Lock()
	srcs := f.srcs
	f.mu.Unlock()
	if srcs == nil {
		return nil // not started yet
	}
	return srcs.SourceRelays(name)
}

// snapshot returns the sources' parts, in order.
func (f *fleet) snapshot() []*sourceParts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.parts)
}

// sourcesRunnable reports the run options that a sources list cannot
// take.
func (g *globals) sourcesRunnable(o runOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	if o.producer != "" {
		return usagef("outbox: producer: names one outbox; with a sources list, give each source its own (sources[i].producer), or none: the default names each source's database and schema")
	}
	return nil
}

// sourcePassword is the password of s's connections that
// --database-password-file, --database-password-command or
// --database-iam-auth give (nil: its URL's).
func (g *globals) sourcePassword(ctx context.Context, s source) (func(context.Context) (string, error), error) {
	password, _, err := g.databasePassword(ctx, s.url)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", s.name, err)
	}
	return password, nil
}
