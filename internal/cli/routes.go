package cli

import (
	"context"

	"fmt"
	"regexp"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// routeSpec is one entry of the config file's routes list. Unset
// settings inherit the run flags.
type routeSpec struct {
	Name           string         `yaml:"name"`
	Topics         []string       `yaml:"topics"`
	Sink           string         `yaml:"sink"`
	FanOut         bool           `yaml:"fanout"`
	Format         string         `yaml:"format"`
	Workers        *int           `yaml:"workers"`
	BatchSize      *int           `yaml:"batch-size"`
	BatchBytes     *int64         `yaml:"batch-bytes"`
	MaxAttempts    *int           `yaml:"max-attempts"`
	RetryInitial   *time.Duration `yaml:"retry-initial"`
	RetryMax       *time.Duration `yaml:"retry-max"`
	PublishTimeout *time.Duration `yaml:"publish-timeout"`
	// Sections are the route's own sink sections, by key ("kafka"); the
	// keys are checked against the sink drivers' sections.
	Sections map[string]yaml.Node `yaml:",inline"`
}

// route is a resolved route: its relay configuration and how to open its
// sink.
type route struct {
	cfg      relay.Config
	open     opener
	sinkName string // redacted URL
	label    string // sink label for metrics
	scheme   string
	format   string // per-route override of --format
	router   bool   // the fan-out router: no sink, no format, no spans
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

var routeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// routerName is the fan-out router's route name in the lanes and relays
// tables; route names cannot start with '~'.
const routerName = "~fanout"

// parseRoutes decodes the routes section, strictly. Topic patterns are
// tried in order and the first matching route takes a message; a route
// with fanout: true instead receives a copy of every message its patterns
// match, whichever route takes it. Messages that match no route go to an
// implicit last route that dead-letters them with reason "no route".
//
// Fan-out needs per-destination state: routes that can share a topic with
// a fan-out route (their patterns overlap) take their messages from the
// copies a router makes (relay.Config.Deliveries), the others read the
// outbox directly as before. Overlap between ordinary routes spreads this
// (if A is fed by the router and B shares topics with A, B is too), so
// that every message of a route takes one path and keeps its key order.
func parseRoutes(g *globals, base relay.Config) ([]route, error) {
	specs, items, err := decodeRouteSpecs(g)
	if specs == nil || err != nil {
		return nil, err
	}
	top := g.file.sinkSections()
	used := map[string]bool{}
	var out []route
	var earlier, all []string
	seen := map[string]bool{}
	catchAll := false
	for i, sp := range specs {
		field := fmt.Sprintf("routes[%d]", i)
		switch {
		case !routeName.MatchString(sp.Name):
			return nil, usagef("outbox: %s.name: %q must be 1-63 lower-case letters, digits, '.', '_' or '-'", field, sp.Name)
		case seen[sp.Name]:
			return nil, usagef("outbox: %s.name: %q used twice", field, sp.Name)
		case len(sp.Topics) == 0:
			return nil, usagef("outbox: %s.topics: at least one topic pattern is required", field)
		case sp.Sink == "":
			return nil, usagef("outbox: %s.sink: required", field)
		}
		seen[sp.Name] = true
		// The route's own sections (each must fit its sink), else the
		// top-level section of its sink's kind, the default of every
		// route of that kind.
		sections := map[string]sinkSection{}
		for kind, n := range sp.Sections {
			line := keyLine(items[i], kind, n.Line)
			if !contains(sinkKinds, kind) {
				return nil, configError(g.file.path, fmt.Errorf("line %d: %s.%s: field %s not found in type cli.routeSpec", line, field, kind, kind))
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
		open, name, err := parseSinkWith(sp.Sink, g, sections)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		cfg := base
		cfg.Route, cfg.Topics = sp.Name, sp.Topics
		if !sp.FanOut {
			cfg.ExcludeTopics = append([]string(nil), earlier...)
		}
		cfg.ID = base.ID + "/" + sp.Name
		setIf(&cfg.Workers, sp.Workers)
		setIf(&cfg.BatchSize, sp.BatchSize)
		setIf(&cfg.BatchBytes, sp.BatchBytes)
		setIf(&cfg.MaxAttempts, sp.MaxAttempts)
		setIf(&cfg.RetryInitial, sp.RetryInitial)
		setIf(&cfg.RetryMax, sp.RetryMax)
		setIf(&cfg.PublishTimeout, sp.PublishTimeout)
		if err := cfg.Validate(); err != nil {
			return nil, usagef("%s: %v", field, err)
		}
		out = append(out, route{cfg: cfg, open: open, sinkName: name, label: sinkLabel(sp.Sink), scheme: sinkScheme(sp.Sink), format: sp.Format})
		if !sp.FanOut {
			earlier = append(earlier, sp.Topics...)
		}
		all = append(all, sp.Topics...)
		for _, t := range sp.Topics {
			if t == "*" {
				catchAll = true
			}
		}
	}
	for _, kind := range sinkKinds {
		if sec, ok := top[kind]; ok && !used[kind] {
			return nil, usagef("outbox: config %s line %d: %s: no route's sink is of this kind, so the section would be ignored",
				g.file.path, sec.line, sec.name)
		}
	}
	if router, ok := fanOutRouter(specs, out, base); ok {
		out = append(out, router)
	}
	if !catchAll {
		cfg := base
		cfg.Route, cfg.Topics, cfg.ExcludeTopics = "unrouted", nil, all
		cfg.ID = base.ID + "/unrouted"
		cfg.Workers = 1
		out = append(out, route{cfg: cfg, open: func() (sinks.Sink, error) { return noRoute{}, nil }, sinkName: "(dead letter)", label: "none"})
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
// from the fan-out router's copies: fan-out routes that share a possible
// topic with another route, ordinary routes that share one with a fan-out
// route, and, spreading, ordinary routes that share one with those.
func fedRoutes(specs []routeSpec) []bool {
	overlap := func(i, j int) bool {
		for _, a := range specs[i].Topics {
			for _, b := range specs[j].Topics {
				if relay.PatternsOverlap(a, b) {
					return true
				}
			}
		}
		return false
	}
	fed := make([]bool, len(specs))
	for i := range specs {
		for j := range specs {
			if i != j && (specs[i].FanOut || specs[j].FanOut) && overlap(i, j) {
				fed[i], fed[j] = true, true
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for i := range specs {
			for j := range specs {
				if fed[i] && !fed[j] && !specs[j].FanOut && !specs[i].FanOut && overlap(i, j) {
					fed[j], changed = true, true
				}
			}
		}
	}
	return fed
}

// fanOutRouter decides which routes are fed by the fan-out router, turns
// them into destinations (rewriting their configuration in place) and
// returns the router's route; false when no route needs one.
func fanOutRouter(specs []routeSpec, routes []route, base relay.Config) (route, bool) {
	fed := fedRoutes(specs)
	rcfg := base
	rcfg.Route, rcfg.ID = routerName, base.ID+"/"+routerName
	for i := range routes {
		if !fed[i] {
			continue
		}
		c := &routes[i].cfg
		rcfg.FanOut = append(rcfg.FanOut, relay.Destination{Route: c.Route, Topics: c.Topics, ExcludeTopics: c.ExcludeTopics})
		rcfg.Topics = append(rcfg.Topics, c.Topics...)
		c.Deliveries, c.Topics, c.ExcludeTopics = true, nil, nil
	}
	if len(rcfg.FanOut) == 0 {
		return route{}, false
	}
	return route{cfg: rcfg, open: func() (sinks.Sink, error) { return nil, nil }, sinkName: "(fan-out router)", label: "none", router: true}, true
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// noRoute refuses every message: a topic no route matches is a
// configuration problem the operator must see, so the message goes to
// the dead-letter table (and can be replayed once a route exists).
type noRoute struct{}

func (noRoute) Send(_ context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	for i, m := range msgs {
		be.Errs[i] = sinks.Permanent(fmt.Errorf("no route matches topic %q", m.Topic))
	}
	return be.Err()
}

func (noRoute) Close(context.Context) error { return nil }
