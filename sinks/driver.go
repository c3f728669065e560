package sinks

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"reflect"
	"slices"
	"strings"
)

// Driver describes one kind of sink to the programs that configure sinks
// from URLs and files (the CLI, its routes, formats and metrics), so that
// none of them switches on URL schemes. Each sink package exports its
// driver (kafkasink.Driver, amqpsink.Driver, ...); sinks/builtin lists
// them.
//
// A driver is plain data plus one function, not an interface: a program
// reads its fields to label, trace and format a sink before the sink is
// opened, and a sink package only fills a struct literal. A sink that can
// check its backend says so by implementing HealthChecker on the opened
// Sink; the driver does not repeat it.
type Driver struct {
	// Schemes are the URL schemes the sink takes, the canonical one first
	// ("amqp", "amqps"). Required; no two drivers of a registry share one.
	Schemes []string
	// Section is the config-file key whose mapping holds the sink's options
	// (the top level and each route may have one), or "" when the sink has
	// no options beyond its URL.
	Section string
	// Params are the query parameters a sink URL may carry, for help
	// texts and the registry's tests. Default: none.
	Params []string
	// Label is the value of the "sink" label of the relay's metrics.
	// Required; the schemes of one driver share it ("amqp" for amqps://).
	Label string
	// System is OpenTelemetry's messaging.system for the sink's spans
	// ("kafka", "rabbitmq", "webhook"). Default: Label.
	System string
	// Binding is the CloudEvents protocol binding of the sink's wire format
	// (format.Binding: "kafka", "http", "amqp"), or "" when the backend has
	// none (stdout, discard), in which case a program picks one to show.
	Binding string
	// Parse validates a sink URL of one of Schemes without connecting
	// anywhere; options from section (nil without one) are overlaid with
	// the URL's, and the URL wins. Errors that come from section are
	// returned as they are, unwrapped, so that the caller can tell them by
	// their type. Required.
	Parse func(raw string, section Decoder) (Config, error)
}

// Decoder decodes a config-file section into dst, a pointer to a sink's
// Config, refusing unknown keys.
type Decoder func(dst any) error

// Config is a parsed and validated sink configuration.
type Config interface {
	// Redacted describes the sink for logs: its URL with every secret
	// replaced (see the Redacted method of each sink's Config).
	Redacted() string
	// Open creates the sink. It may start connecting in the background
	// but does not wait for the backend.
	Open(env Env) (Sink, error)
}

// Env is what a program gives every sink it opens.
type Env struct {
	// Logger receives the sink's logs. Default: discarded.
	Logger *slog.Logger
	// Stdout is where a sink that writes to standard output writes.
	// Default: os.Stdout.
	Stdout io.Writer
}

// TypedConfig is what a sink's own Config provides for Typed.
type TypedConfig interface {
	Validate() error
	Redacted() string
}

// Typed builds Driver.Parse from a sink's ParseURL and constructor. The
// file section is decoded into a fresh C and every non-zero field the URL
// set is copied onto it, so that the URL wins field by field; the result
// is validated.
func Typed[C TypedConfig, S Sink](parse func(raw string) (C, error), open func(C, Env) (S, error)) func(string, Decoder) (Config, error) {
	return func(raw string, section Decoder) (Config, error) {
		cfg, err := parse(raw)
		if err != nil {
			return nil, err
		}
		if section != nil {
			var fromFile C
			if err := section(&fromFile); err != nil {
				return nil, err
			}
			overlay(reflect.ValueOf(&fromFile).Elem(), reflect.ValueOf(cfg))
			cfg = fromFile
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return typedConfig[C, S]{cfg: cfg, open: open}, nil
	}
}

// WithLogger adapts a sink constructor that needs only a logger (most
// do) to Typed.
func WithLogger[C any, S Sink](newSink func(C, *slog.Logger) (S, error)) func(C, Env) (S, error) {
	return func(c C, env Env) (S, error) { return newSink(c, env.Logger) }
}

type typedConfig[C TypedConfig, S Sink] struct {
	cfg  C
	open func(C, Env) (S, error)
}

func (t typedConfig[C, S]) Redacted() string { return t.cfg.Redacted() }
func (t typedConfig[C, S]) String() string   { return t.cfg.Redacted() }

func (t typedConfig[C, S]) Open(env Env) (Sink, error) {
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := t.open(t.cfg, env)
	if err != nil {
		// A nil *kafkasink.Sink in a Sink interface is not nil.
		return nil, err
	}
	return s, nil
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

// Registry is a fixed set of drivers, looked up by URL scheme. It is built
// once from an explicit list (see sinks/builtin) rather than filled by
// init functions: which sinks a program has is then visible in one place,
// and a test can build a registry of its own.
type Registry struct {
	drivers  []Driver
	byScheme map[string]int
}

// NewRegistry returns a registry of drivers. It panics when a driver lacks
// a scheme, a label or Parse, or when two drivers claim the same scheme or
// section: those are programming errors found by the first test.
func NewRegistry(drivers ...Driver) *Registry {
	r := &Registry{drivers: drivers, byScheme: map[string]int{}}
	sections := map[string]bool{}
	for i, d := range drivers {
		if len(d.Schemes) == 0 || d.Label == "" || d.Parse == nil {
			panic(fmt.Sprintf("outbox: sinks: driver %d (%v) needs Schemes, Label and Parse", i, d.Schemes))
		}
		for _, s := range d.Schemes {
			if _, dup := r.byScheme[s]; dup || s != strings.ToLower(s) {
				panic(fmt.Sprintf("outbox: sinks: scheme %q registered twice or not lower-case", s))
			}
			r.byScheme[s] = i
		}
		if d.Section != "" {
			if sections[d.Section] {
				panic(fmt.Sprintf("outbox: sinks: section %q registered twice", d.Section))
			}
			sections[d.Section] = true
		}
	}
	return r
}

// Lookup returns the driver of a URL scheme (compared without case, as
// URL schemes are).
func (r *Registry) Lookup(scheme string) (Driver, bool) {
	i, ok := r.byScheme[strings.ToLower(scheme)]
	if !ok {
		return Driver{}, false
	}
	return r.drivers[i], true
}

// Drivers returns the drivers in registration order.
func (r *Registry) Drivers() []Driver { return slices.Clone(r.drivers) }

// Schemes returns every scheme, in registration order.
func (r *Registry) Schemes() []string {
	var out []string
	for _, d := range r.drivers {
		out = append(out, d.Schemes...)
	}
	return out
}

// Sections returns the config-file sections of the drivers that have one,
// in registration order.
func (r *Registry) Sections() []string {
	var out []string
	for _, d := range r.drivers {
		if d.Section != "" {
			out = append(out, d.Section)
		}
	}
	return out
}

// Scheme returns the scheme of a sink URL: "stdout" for "stdout", "kafka"
// for "kafka://h:9092". A URL that does not parse still yields what
// precedes its first colon, so that the right driver reports the error.
func Scheme(raw string) string {
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
