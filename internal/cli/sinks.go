package cli

import (
	"fmt"
	"reflect"
	"regexp"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
	"github.com/outbox-relay/outbox-relay/sinks/stdout"
)

// sinkSchemes lists the --sink URL schemes this build understands.
var sinkSchemes = []string{"stdout", "discard", "kafka", "amqp", "amqps", "http", "https"}

func sinkScheme(raw string) string {
	if !strings.Contains(raw, ":") {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		scheme, _, _ := strings.Cut(raw, ":")
		return scheme
	}
	return u.Scheme
}

// validScheme is RFC 3986's scheme syntax.
var validScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// opener creates the sink once configuration is known to be valid.
type opener func() (sinks.Sink, error)

// parseSink validates the sink named by a --sink URL (and its config-file
// section, for options that do not fit in a URL) without connecting, and
// returns how to open it and its name with secrets redacted.
func parseSink(raw string, g *globals) (opener, string, error) {
	return parseSinkWith(raw, g, g.file.sinkSections())
}

// sinkSection is a config-file section that configures one kind of sink.
type sinkSection struct {
	node *yaml.Node
	name string // in errors: "kafka", "routes[2].kafka"
	line int    // of its key
}

// sinkKinds are the config sections that configure one kind of sink.
var sinkKinds = []string{"kafka", "amqp", "http"}

// sinkSections returns the file's top-level sink sections by kind.
func (fc *fileConfig) sinkSections() map[string]sinkSection {
	out := map[string]sinkSection{}
	for _, kind := range sinkKinds {
		if n := fc.sections[kind]; n != nil {
			out[kind] = sinkSection{node: n, name: kind, line: fc.lines[kind]}
		}
	}
	return out
}

// sectionFor names the config section of a sink scheme ("" when the sink
// has none).
func sectionFor(scheme string) string {
	switch scheme {
	case "kafka":
		return "kafka"
	case "amqp", "amqps":
		return "amqp"
	case "http", "https":
		return "http"
	}
	return ""
}

// parseSinkWith is parseSink with the sink sections to use (a route may
// carry its own).
func parseSinkWith(raw string, g *globals, sections map[string]sinkSection) (opener, string, error) {
	log := g.log
	if raw == "" {
		return nil, "", usagef("outbox: sink: required (one of %s URLs; see --help)", strings.Join(sinkSchemes, ", "))
	}
	scheme := sinkScheme(raw)
	// A section for another kind of sink would be ignored: refuse it
	// (once the scheme is known to be one; an unknown one is reported
	// below).
	for _, kind := range sinkKinds {
		if sec, ok := sections[kind]; ok && kind != sectionFor(scheme) && contains(sinkSchemes, scheme) {
			return nil, "", usagef("outbox: config %s line %d: %s: this section configures the %s sink, but the sink is %q",
				g.file.path, sec.line, sec.name, kind, scheme)
		}
	}
	switch scheme {
	case "stdout":
		cfg, err := stdout.ParseURL(raw)
		if err != nil {
			return nil, "", &usageError{err}
		}
		cfg.Output = g.stdout
		return func() (sinks.Sink, error) { return stdout.New(cfg, log) }, cfg.Redacted(), nil
	case "discard":
		cfg, err := discard.ParseURL(raw)
		if err != nil {
			return nil, "", &usageError{err}
		}
		return func() (sinks.Sink, error) { return discard.New(cfg, log) }, cfg.Redacted(), nil
	case "kafka":
		cfg, err := sinkConfig(raw, g, sections, "kafka", kafkasink.ParseURL)
		if err != nil {
			return nil, "", err
		}
		return func() (sinks.Sink, error) { return kafkasink.New(cfg, log) }, cfg.Redacted(), nil
	case "amqp", "amqps":
		cfg, err := sinkConfig(raw, g, sections, "amqp", amqpsink.ParseURL)
		if err != nil {
			return nil, "", err
		}
		return func() (sinks.Sink, error) { return amqpsink.New(cfg, log) }, cfg.Redacted(), nil
	case "http", "https":
		cfg, err := sinkConfig(raw, g, sections, "http", httpsink.ParseURL)
		if err != nil {
			return nil, "", err
		}
		return func() (sinks.Sink, error) { return httpsink.New(cfg, log) }, cfg.Redacted(), nil
	}
	// The scheme is echoed only when it is one: a malformed URL's
	// "scheme" may be the whole of it, password included.
	var note string
	if validScheme.MatchString(scheme) {
		note = fmt.Sprintf(" (scheme %q)", scheme)
	}
	return nil, "", usagef("outbox: sink: unsupported sink %q%s; supported schemes: %s",
		redactURL(raw), note, strings.Join(sinkSchemes, ", "))
}

// sinkConfig parses a sink URL and, when the config file has a section for
// the sink, decodes it strictly (unknown keys are errors). Options given in
// the URL win over the same options in the file. The result is validated.
func sinkConfig[T interface{ Validate() error }](raw string, g *globals, sections map[string]sinkSection, section string, parse func(string) (T, error)) (T, error) {
	cfg, err := parse(raw)
	if err != nil {
		return cfg, &usageError{err}
	}
	if sec, ok := sections[section]; ok {
		var fromFile T
		if err := strictDecode(sec.node, &fromFile, sec.name); err != nil {
			return cfg, configError(g.file.path, err)
		}
		overlay(reflect.ValueOf(&fromFile).Elem(), reflect.ValueOf(cfg))
		cfg = fromFile
	}
	if err := cfg.Validate(); err != nil {
		return cfg, &usageError{err}
	}
	return cfg, nil
}

// overlay copies every non-zero exported field of src onto dst.
func overlay(dst, src reflect.Value) {
	for i := 0; i < src.NumField(); i++ {
		if !src.Type().Field(i).IsExported() {
			continue
		}
		if f := src.Field(i); !f.IsZero() {
			dst.Field(i).Set(f)
		}
	}
}
