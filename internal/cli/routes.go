package cli

import (
	"bytes"
	"context"

	"fmt"
	"regexp"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// routeSpec is one entry of the config file's routes list. Unset
// settings inherit the run flags.
type routeSpec struct {
	Name           string         `yaml:"name"`
	Topics         []string       `yaml:"topics"`
	Sink           string         `yaml:"sink"`
	Format         string         `yaml:"format"`
	Workers        *int           `yaml:"workers"`
	BatchSize      *int           `yaml:"batch-size"`
	MaxAttempts    *int           `yaml:"max-attempts"`
	RetryInitial   *time.Duration `yaml:"retry-initial"`
	RetryMax       *time.Duration `yaml:"retry-max"`
	PublishTimeout *time.Duration `yaml:"publish-timeout"`
	Kafka          yaml.Node      `yaml:"kafka"`
	AMQP           yaml.Node      `yaml:"amqp"`
	HTTP           yaml.Node      `yaml:"http"`
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
}

// applyFormat wraps the route's sink in the message format chosen by
// --format (or the route's own format).
func (rt *route) applyFormat(o runOptions) error {
	name := o.format
	if rt.format != "" {
		name = rt.format
	}
	binding, ok := format.BindingForScheme(rt.scheme)
	if !ok {
		binding = format.BindingKafka // stdout, discard: show the Kafka form
	}
	f, err := format.Parse(name, format.Options{Binding: binding, Source: o.ceSource, AMQPPrefix: o.ceAMQPPrefix})
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

// messagingSystem names the sink for OpenTelemetry's messaging.system.
func messagingSystem(scheme string) string {
	switch scheme {
	case "kafka":
		return "kafka"
	case "amqp", "amqps":
		return "rabbitmq"
	case "http", "https":
		return "webhook"
	case "":
		return "none"
	}
	return scheme
}

var routeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// parseRoutes decodes the routes section, strictly. Topic patterns are
// tried in order (first match wins); each route excludes the patterns of
// the routes before it. Messages that match no route go to an implicit
// last route that dead-letters them with reason "no route".
func parseRoutes(g *globals, base relay.Config) ([]route, error) {
	node := g.file.sections["routes"]
	if node == nil {
		return nil, nil
	}
	b, err := yaml.Marshal(node)
	if err != nil {
		return nil, usagef("outbox: config %s: routes: %v", g.file.path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var specs []routeSpec
	if err := dec.Decode(&specs); err != nil {
		return nil, usagef("outbox: config %s: routes: %v", g.file.path, err)
	}
	if len(specs) == 0 {
		return nil, usagef("outbox: config %s: routes: empty list", g.file.path)
	}
	var out []route
	var earlier []string
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
		sections := map[string]*yaml.Node{}
		for name, n := range map[string]*yaml.Node{"kafka": &sp.Kafka, "amqp": &sp.AMQP, "http": &sp.HTTP} {
			if n.Kind != 0 {
				sections[name] = n
			} else if top := g.file.sections[name]; top != nil {
				sections[name] = top
			}
		}
		open, name, err := parseSinkWith(sp.Sink, g, sections)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		cfg := base
		cfg.Route, cfg.Topics = sp.Name, sp.Topics
		cfg.ExcludeTopics = append([]string(nil), earlier...)
		cfg.ID = base.ID + "/" + sp.Name
		setIf(&cfg.Workers, sp.Workers)
		setIf(&cfg.BatchSize, sp.BatchSize)
		setIf(&cfg.MaxAttempts, sp.MaxAttempts)
		setIf(&cfg.RetryInitial, sp.RetryInitial)
		setIf(&cfg.RetryMax, sp.RetryMax)
		setIf(&cfg.PublishTimeout, sp.PublishTimeout)
		if err := cfg.Validate(); err != nil {
			return nil, usagef("%s: %v", field, err)
		}
		out = append(out, route{cfg: cfg, open: open, sinkName: name, label: relayprom.SinkLabel(sp.Sink), scheme: sinkScheme(sp.Sink), format: sp.Format})
		earlier = append(earlier, sp.Topics...)
		for _, t := range sp.Topics {
			if t == "*" {
				catchAll = true
			}
		}
	}
	if !catchAll {
		cfg := base
		cfg.Route, cfg.Topics, cfg.ExcludeTopics = "unrouted", nil, earlier
		cfg.ID = base.ID + "/unrouted"
		cfg.Workers = 1
		out = append(out, route{cfg: cfg, open: func() (sinks.Sink, error) { return noRoute{}, nil }, sinkName: "(dead letter)", label: "none"})
	}
	return out, nil
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
