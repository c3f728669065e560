package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/builtin"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// sinkDrivers are the sinks this build can open; everything the CLI knows
// about a kind of sink (schemes, file section, labels) comes from them.
var sinkDrivers = builtin.Registry

// sinkSchemes lists the --sink URL schemes this build understands.
var sinkSchemes = sinkDrivers.Schemes()

func sinkScheme(raw string) string { return sinks.Scheme(raw) }

// sinkLabel is the metrics label of the sink of a --sink URL: its
// driver's, else the scheme itself.
func sinkLabel(raw string) string {
	if d, ok := sinkDrivers.Lookup(sinkScheme(raw)); ok {
		return d.Label
	}
	return sinkScheme(raw)
}

// sinkBinding is the CloudEvents binding for a sink scheme; sinks without
// one (stdout, discard) show the Kafka form.
func sinkBinding(scheme string) format.Binding {
	if d, ok := sinkDrivers.Lookup(scheme); ok && d.Binding != "" {
		return format.Binding(d.Binding)
	}
	return format.BindingKafka
}

// messagingSystem names the sink for OpenTelemetry's messaging.system.
func messagingSystem(scheme string) string {
	d, ok := sinkDrivers.Lookup(scheme)
	switch {
	case scheme == "":
		return "none"
	case !ok:
		return scheme
	case d.System != "":
		return d.System
	}
	return d.Label
}

// validScheme is RFC 3986's scheme syntax.
var validScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// opener creates the sink once configuration is known to be valid.
type opener func() (sinks.Sink, error)

// parseSink validates the sink named by a --sink URL (and its config-file
// section, for options that do not fit in a URL) without connecting, and
// returns how to open it and its name with secrets redacted.
func parseSink(raw string, g *globals) (opener, string, error) {
	from := g.origins["sink"]
	if from == "" {
		from = "--sink"
	}
	return parseSinkWith(raw, from, g, g.file.sinkSections())
}

// sinkSection is a config-file section that configures one kind of sink.
type sinkSection struct {
	node *yaml.Node
	name string // in errors: "kafka", "routes[2].kafka"
	line int    // of its key
}

// sinkKinds are the config sections that configure one kind of sink.
var sinkKinds = sinkDrivers.Sections()

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
	d, _ := sinkDrivers.Lookup(scheme)
	return d.Section
}

// parseSinkWith is parseSink with the sink sections to use (a route may
// carry its own); from says where raw was given ("--sink", "OUTBOX_SINK",
// "routes[1].sink at line 7"), for an error about a key that raw and the
// section set differently.
func parseSinkWith(raw, from string, g *globals, sections map[string]sinkSection) (opener, string, error) {
	if raw == "" {
		return nil, "", usagef("outbox: sink: required (one of %s URLs; see --help)", strings.Join(sinkSchemes, ", "))
	}
	scheme := sinkScheme(raw)
	d, ok := sinkDrivers.Lookup(scheme)
	if !ok {
		// The scheme is echoed only when it is one: a malformed URL's
		// "scheme" may be the whole of it, password included.
		var note string
		if validScheme.MatchString(scheme) {
			note = fmt.Sprintf(" (scheme %q)", scheme)
		}
		return nil, "", usagef("outbox: sink: unsupported sink %q%s; supported schemes: %s",
			redactURL(raw), note, strings.Join(sinkSchemes, ", "))
	}
	// A section for another kind of sink would be ignored: refuse it.
	for _, kind := range sinkKinds {
		if sec, ok := sections[kind]; ok && kind != d.Section {
			return nil, "", usagef("outbox: config %s line %d: %s: this section configures the %s sink, but the sink is %q",
				g.file.path, sec.line, sec.name, kind, scheme)
		}
	}
	var decode sinks.Decoder
	sec, hasSection := sections[d.Section]
	if hasSection && d.Section != "" {
		decode = func(dst any) error {
			if err := strictDecode(sec.node, dst, sec.name); err != nil {
				return configError(g.file.path, err)
			}
			return nil
		}
	}
	cfg, err := d.Parse(raw, decode)
	if err != nil {
		var ue *usageError
		var conflict *sinks.ConflictError
		switch {
		case errors.As(err, &ue):
		case errors.As(err, &conflict) && hasSection:
			err = usagef("outbox: config %s line %d: %s.%s: set both here and in the sink URL (%s), to different values%s; set it in one place",
				g.file.path, pathLine(sec.node, conflict.Key, sec.line), sec.name, conflict.Key, from, conflict.Values())
		default:
			err = &usageError{err}
		}
		return nil, "", err
	}
	env := sinks.Env{Logger: g.log, Stdout: g.stdout}
	return func() (sinks.Sink, error) { return cfg.Open(env) }, cfg.Redacted(), nil
}

// pathLine returns the line of the key at path ("tls.ca_file") in the
// mapping node, or def when the file does not spell it out (a merge key).
func pathLine(node *yaml.Node, path string, def int) int {
	line := def
	for _, key := range strings.Split(path, ".") {
		if node != nil && node.Kind == yaml.AliasNode {
			node = node.Alias
		}
		if node == nil || node.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for i := 0; i+1 < len(node.Content); i += 2 {
			if node.Content[i].Value == key {
				line, next = node.Content[i].Line, node.Content[i+1]
			}
		}
		if next == nil {
			return def
		}
		node = next
	}
	return line
}
