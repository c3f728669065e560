package cli

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayotel"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// routeSpec is one entry of the config file's routes list. Unset
// settings inherit the run flags.
type routeSpec struct {
	Name            string         `yaml:"name"`
	Topics          []string       `yaml:"topics"`
	Sink            string         `yaml:"sink"`
	FanOut          bool           `yaml:"fanout"`
	Format          string         `yaml:"format"`
	Workers         *int           `yaml:"workers"`
	Pipeline        *int           `yaml:"pipeline"`
	BatchSize       *int           `yaml:"batch-size"`
	BatchBytes      *int64         `yaml:"batch-bytes"`
	MaxMessageBytes *int64         `yaml:"max-message-bytes"`
	MaxAttempts     *int           `yaml:"max-attempts"`
	RateLimit       *float64       `yaml:"rate-limit"`
	RateBurst       *int           `yaml:"rate-burst"`
	OnDeadLetter    *string        `yaml:"on-dead-letter"`
	RetryInitial    *time.Duration `yaml:"retry-initial"`
	RetryMax        *time.Duration `yaml:"retry-max"`
	PublishTimeout  *time.Duration `yaml:"publish-timeout"`
	// Sections are the route's own sink sections, by key ("kafka"); the
	// keys are checked against the sink drivers' sections.
	Sections map[string]yaml.Node `yaml:",inline"`
}

// route is a resolved route: its relay configuration and how to open its
// sink.
type route struct {
	spec     relay.Route // name, topics, fan-out; the sink once opened
	cfg      relay.Config
	open     opener
	sinkName string // redacted URL
	label    string // sink label for metrics
	scheme   string
	format   string // per-route override of --format
	router   bool   // the fan-out router: no sink, no format, no spans
}

// builtIn describes the relays relay.Set adds beside the routes.
var builtIn = map[string]route{
	relay.RouterRoute:   {sinkName: "(fan-out router)", label: "none", router: true},
	relay.UnroutedRoute: {sinkName: "(dead letter)", label: "none"},
}

// describe returns the route of the Set's relay serving name.
func describe(routes []route, name string) route {
	for _, rt := range routes {
		if rt.cfg.Route == name {
			return rt
		}
	}
	return builtIn[name]
}

// applyFormat wraps the route's sink in the message format chosen by
// --format (or the route's own format).
func (rt *route) applyFormat(o runOptions) error {
	if rt.router {
		return nil
	}
	name := o.format
	if rt.format != "" {
		name = rt.format
	}
	f, err := format.Parse(name, format.Options{Binding: sinkBinding(rt.scheme), Source: o.ceSource, AMQPPrefix: o.ceAMQPPrefix})
	if err != nil {
		return &usageError{err}
	}
	if f.Name() == format.NameRaw {
		return nil
	}
	open := rt.open
	rt.open = func() (sinks.Sink, error) {
		s, err := open()
		if err != nil {
			return nil, err
		}
		return format.Wrap(s, f), nil
	}
	return nil
}

// parseRoutes decodes the routes section, strictly, into the routes of a
// relay.Set (which documents how routes take messages, fan out and
// dead-letter what no route takes); nil without one.
func parseRoutes(g *globals, base relay.Config) ([]route, error) {
	specs, items, err := decodeRouteSpecs(g)
	if specs == nil || err != nil {
		return nil, err
	}
	top := g.file.sinkSections()
	used := map[string]bool{}
	var out []route
	for i, sp := range specs {
		field := fmt.Sprintf("routes[%d]", i)
		if sp.Sink == "" {
			return nil, usagef("outbox: %s.sink: required", field)
		}
		// The route's own sections (each must fit its sink), else the
		// top-level section of its sink's kind, the default of every
		// route of that kind.
		sections := map[string]sinkSection{}
		for kind, n := range sp.Sections {
			line := keyLine(items[i], kind, n.Line)
			if !contains(sinkKinds, kind) {
				keys, _ := yamlFields(reflect.TypeOf(routeSpec{}))
				for _, k := range sinkKinds {
					keys[k] = nil
				}
				return nil, configError(g.file.path, fmt.Errorf("line %d: %s.%s: unknown key %q in %s%s", line, field, kind, kind, field, knownKeys(keys, kind)))
			}
			sections[kind] = sinkSection{node: &n, name: field + "." + kind, line: line}
		}
		kind := sectionFor(sinkScheme(sp.Sink))
		if _, own := sections[kind]; !own && kind != "" {
			if sec, ok := top[kind]; ok {
				sections[kind] = sec
			}
		}
		used[kind] = true
		cfg := base
		cfg.Route = sp.Name
		setIf(&cfg.Workers, sp.Workers)
		setIf(&cfg.Pipeline, sp.Pipeline)
		setIf(&cfg.BatchSize, sp.BatchSize)
		setIf(&cfg.BatchBytes, sp.BatchBytes)
		setIf(&cfg.MaxMessageBytes, sp.MaxMessageBytes)
		setIf(&cfg.MaxAttempts, sp.MaxAttempts)
		setIf(&cfg.RateLimit, sp.RateLimit)
		setIf(&cfg.RateBurst, sp.RateBurst)
		setIf(&cfg.OnDeadLetter, sp.OnDeadLetter)
		setIf(&cfg.RetryInitial, sp.RetryInitial)
		setIf(&cfg.RetryMax, sp.RetryMax)
		setIf(&cfg.PublishTimeout, sp.PublishTimeout)
		rt := route{spec: relay.Route{Name: sp.Name, Topics: sp.Topics, FanOut: sp.FanOut}, cfg: cfg,
			label: sinkLabel(sp.Sink), scheme: sinkScheme(sp.Sink), format: sp.Format}
		from := fmt.Sprintf("%s.sink at line %d", field, keyLine(items[i], "sink", 0))
		if rt.open, rt.sinkName, err = parseSinkWith(sp.Sink, from, g, sections); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		// Zero in the file is a mistake, not "the default".
		if err := cfg.Validate(); err != nil {
			return nil, usagef("%s: %v", field, err)
		}
		out = append(out, rt)
	}
	// Names, patterns, and how the routes share topics: relay.Set's rules.
	if _, err := setConfig(out, nil, base, setFlags{}, nil).Plan(); err != nil {
		return nil, &usageError{err}
	}
	for _, kind := range sinkKinds {
		if sec, ok := top[kind]; ok && !used[kind] {
			return nil, usagef("outbox: config %s line %d: %s: no route's sink is of this kind, so the section would be ignored",
				g.file.path, sec.line, sec.name)
		}
	}
	return out, nil
}

// decodeRouteSpecs decodes the config file's routes section, strictly,
// and returns each route's node (for the lines of its keys); nil without
// one.
func decodeRouteSpecs(g *globals) ([]routeSpec, []*yaml.Node, error) {
	node := g.file.sections["routes"]
	if node == nil {
		return nil, nil, nil
	}
	var specs []routeSpec
	if err := strictDecode(node, &specs, "routes"); err != nil {
		return nil, nil, configError(g.file.path, err)
	}
	if len(specs) == 0 {
		return nil, nil, usagef("outbox: config %s: routes: empty list", g.file.path)
	}
	if node.Kind == yaml.AliasNode {
		node = node.Alias
	}
	items := make([]*yaml.Node, len(specs))
	for i := range items {
		if i < len(node.Content) {
			items[i] = node.Content[i]
		}
	}
	return specs, items, nil
}

// keyLine returns the line of key in mapping m, or def.
func keyLine(m *yaml.Node, key string, def int) int {
	if m != nil && m.Kind == yaml.AliasNode {
		m = m.Alias
	}
	if m == nil || m.Kind != yaml.MappingNode {
		return def
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i].Line
		}
	}
	return def
}

// fedRoutes reports, route by route, whether the route takes its messages
// from the fan-out router's copies, isolated or not (see
// relay.SetConfig.Feeds).
func fedRoutes(specs []routeSpec, isolate bool) []bool {
	routes := make([]relay.Route, len(specs))
	for i, sp := range specs {
		routes[i] = relay.Route{Name: sp.Name, Topics: sp.Topics, FanOut: sp.FanOut}
	}
	return relay.SetConfig{Routes: routes, IsolateRoutes: isolate}.Feeds()
}

// The values of --readiness.
const (
	readyAnyRoute   = "any-route"
	readyEveryRoute = "every-route"
)

// setFlags are the run options that concern the routes as a whole.
type setFlags struct {
	isolate    bool // --isolate-routes
	everyRoute bool // --readiness every-route
}

func (o runOptions) setFlags() setFlags {
	return setFlags{isolate: o.isolateRoutes, everyRoute: o.readiness == readyEveryRoute}
}

// setConfig is the relay.Set of the routes, on their opened sinks (nil:
// not opened yet, enough to Plan), with the options f.
func setConfig(routes []route, opened []sinks.Sink, base relay.Config, f setFlags, hooks func(string) relay.Hooks) relay.SetConfig {
	sc := relay.SetConfig{Config: base, Hooks: hooks, IsolateRoutes: f.isolate, ReadyOnEveryRoute: f.everyRoute}
	for i, rt := range routes {
		r := rt.spec
		r.Config = &routes[i].cfg
		if opened != nil {
			r.Sink = opened[i]
		}
		sc.Routes = append(sc.Routes, r)
	}
	return sc
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// routeHooks returns the hooks of each planned relay, by route: its
// metrics and, unless it is the fan-out router (it publishes nothing, so
// it has no batches, spans or sink), its traces.
func routeHooks(routes []route, planned []relay.Config, metrics *relayprom.Metrics, tracing bool) (func(string) relay.Hooks, error) {
	hooks := map[string]relay.Hooks{}
	for _, cfg := range planned {
		rt := describe(routes, cfg.Route)
		hooks[cfg.Route] = metrics.Hooks(cfg.Route, rt.label)
		if tracing && !rt.router {
			th, err := relayotel.New(relayotel.Config{System: messagingSystem(rt.scheme)})
			if err != nil {
				return nil, err
			}
			hooks[cfg.Route] = relay.MultiHooks(hooks[cfg.Route], th)
		}
	}
	return func(route string) relay.Hooks { return hooks[route] }, nil
}

// runner is what run runs: one relay for --sink, a relay.Set for routes.
type runner interface {
	Run(ctx context.Context) error
	Live() error
	Ready(ctx context.Context) error
}

// relaysOf returns the relays that x runs (a Set's, or x itself).
func relaysOf(x runner) func() []*relay.Relay {
	if set, ok := x.(*relay.Set); ok {
		return set.Relays
	}
	r := x.(*relay.Relay)
	return func() []*relay.Relay { return []*relay.Relay{r} }
}

// newRelays builds the relays of the routes on their opened sinks.
func newRelays(pool *pgxpool.Pool, routes []route, opened []sinks.Sink, base relay.Config, single bool, f setFlags, hooks func(string) relay.Hooks) (runner, error) {
	if !single {
		return relay.NewSet(pool, setConfig(routes, opened, base, f, hooks))
	}
	cfg := routes[0].cfg
	cfg.Hooks = hooks(cfg.Route)
	return relay.New(pool, opened[0], cfg)
}
