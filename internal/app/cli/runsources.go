package cli

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
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
}

// runSources is run for a config file's sources list: one relay.Sources
// over a pool per source, the routes and their sinks shared, the
// metrics labelled by source.
func (g *globals) runSources(parent context.Context, o runOptions) error {
	if err := g.sourcesRunnable(o); err != nil {
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
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	closing := stopDeadline(ctx, parent, planned)
	opened, closeSinks, err := g.openSinks(routes, closing)
	defer closeSinks()
	if err != nil {
		return err
	}
	reg, otelOn, flushOTel, err := g.telemetry(ctx, closing)
	if err != nil {
		return err
	}
	defer flushOTel()
	relayprom.RegisterBuildInfo(reg, version())
	parts, closePools, err := g.openSources(ctx, parent, o, reg, relay.PoolConfig{Workers: workers, MaxConns: maxConns,
		PublishTimeout: base.PublishTimeout, SynchronousCommit: o.syncCommit, IdleTime: sourceIdleTime})
	defer closePools()
	if err != nil {
		return err
	}
	srcs, err := newSources(g, parts, routes, opened, base, single, o, planned, otelOn.Traces)
	if err != nil {
		return err
	}
	reg.MustRegister(relayprom.NewHealthCollector(srcs, 2*time.Second), relayprom.NewSourcesCollector(srcs.States))
	for _, p := range parts {
		sreg := prometheus.WrapRegistererWith(prometheus.Labels{"source": p.name}, reg)
		sreg.MustRegister(relayprom.NewStatsCollector(func() []*relay.Relay { return srcs.SourceRelays(p.name) }))
	}
	for _, cfg := range planned {
		g.log.Info("relaying", "route", cfg.Route, "topics", cfg.Topics, "sink", describe(routes, cfg.Route).sinkName)
	}
	if o.adminAddr != "" {
		stopAdmin, err := g.serveAdmin(parent, o, adminParts{base: base, tokens: tokens, routes: routes,
			planned: planned, reg: reg, relays: srcs, sources: parts, states: srcs.States}, closing)
		defer stopAdmin()
		if err != nil {
			return err
		}
	}
	if o.adminAddr != "" || otelOn.Metrics {
		for _, p := range parts {
			defer g.watchOutbox(parent, p.pool, p.schema, p.metrics, o.metricsInterval, g.log.With("source", p.name))()
		}
	}
	g.log.Info("starting", "sources", len(parts), "routes", len(planned), "max_conns_per_source", maxConns)
	if o.exitWhenEmpty {
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		outboxes := make([]outboxAt, len(parts))
		for i, p := range parts {
			outboxes[i] = outboxAt{p.pool, p.schema}
		}
		go g.cancelWhenEmpty(runCtx, outboxes, cancel)
		ctx = runCtx
	}
	return srcs.Run(ctx)
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

// openSources opens a pool per source (with --migrate, it migrates each
// source's schema; a source whose database is down then starts like any
// other, and its relays report it) and registers its metrics on reg.
func (g *globals) openSources(ctx, parent context.Context, o runOptions, reg *prometheus.Registry, pc relay.PoolConfig) ([]sourceParts, func(), error) {
	var parts []sourceParts
	closeAll := func() {
		for _, p := range parts {
			p.pool.Close()
		}
	}
	for _, s := range g.sources {
		pc := pc
		pc.URL = s.url
		var err error
		if pc.Password, err = g.sourcePassword(ctx, s); err != nil {
			return parts, closeAll, err
		}
		pool, err := relay.NewPool(parent, pc)
		if err != nil {
			return parts, closeAll, err
		}
		parts = append(parts, sourceParts{source: s, pool: pool})
		if o.migrate {
			if _, err := migrations.Apply(ctx, pool, s.schema); err != nil {
				g.log.Error("source not migrated", "source", s.name, "schema", s.schema, "error", err)
			}
		}
		sreg := prometheus.WrapRegistererWith(prometheus.Labels{"source": s.name}, reg)
		sreg.MustRegister(relayprom.NewPoolCollector(pool))
		parts[len(parts)-1].metrics = relayprom.NewSource(reg, s.name)
	}
	return parts, closeAll, nil
}

// sourcePassword is the password of s's connections that
// --database-password-file, --database-password-command or
// --database-iam-auth give (nil: its URL's).
func (g *globals) sourcePassword(ctx context.Context, s source) (func(context.Context) (string, error), error) {
	url := g.databaseURL
	defer func() { g.databaseURL = url }()
	g.databaseURL = s.url
	password, _, err := g.databasePassword(ctx)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", s.name, err)
	}
	return password, nil
}

// newSources builds the relay.Sources of parts: each source runs the
// routes (or the one --sink relay) on the shared opened sinks, with its
// schema, producer and metrics.
func newSources(g *globals, parts []sourceParts, routes []route, opened []sinks.Sink, base relay.Config, single bool,
	o runOptions, planned []relay.Config, tracing bool) (*relay.Sources, error) {
	var list []relay.Source
	for _, p := range parts {
		hooks, err := routeHooks(routes, planned, p.metrics, tracing)
		if err != nil {
			return nil, err
		}
		cfg := base
		cfg.Schema, cfg.Producer = p.schema, p.producer
		src := relay.Source{Name: p.name, Pool: p.pool}
		if single {
			src.Set = relay.SetConfig{Config: routes[0].cfg, Hooks: hooks}
			src.Set.Config.Schema, src.Set.Config.Producer = p.schema, p.producer
			src.Sink = opened[0]
		} else {
			src.Set = setConfig(routes, opened, cfg, o.setFlags(), hooks)
		}
		list = append(list, src)
	}
	srcs, err := relay.NewSources(relay.SourcesConfig{Sources: list, Logger: g.log})
	if err != nil {
		return nil, &usageError{err}
	}
	return srcs, nil
}
