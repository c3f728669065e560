package sinks

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/redact"
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
	// the URL's before the whole is validated, and a key that both set to
	// different values is a *ConflictError (see Typed). Errors that come
	// from section, and ConflictErrors, are returned as they are,
	// unwrapped, so that the caller can tell them by their type. Required.
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

// Typed builds Driver.Parse from a sink's URL decoder and constructor.
// decode reads the URL alone and must not validate: a key the URL leaves
// out (an AMQP exchange, an SQS queue URL) may come from the file
// section. The section is decoded into a fresh C, the URL's fields are
// laid over it field by field (into nested sections such as tls), and
// only the result is validated. A key that both set to different values
// is a *ConflictError, never a silent choice; a C that implements Refiner
// may accept a section's value that refines the URL's.
func Typed[C TypedConfig, S Sink](decode func(raw string) (C, error), open func(C, Env) (S, error)) func(string, Decoder) (Config, error) {
	return func(raw string, section Decoder) (Config, error) {
		cfg, err := decode(raw)
		if err != nil {
			return nil, err
		}
		if section != nil {
			var fromFile C
			if err := section(&fromFile); err != nil {
				return nil, err
			}
			refiner, _ := any(fromFile).(Refiner)
			if err := overlay(reflect.ValueOf(&fromFile).Elem(), reflect.ValueOf(cfg), "", refiner); err != nil {
				err.Scheme = Scheme(raw)
				return nil, err
			}
			cfg = fromFile
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return typedConfig[C, S]{cfg: cfg, open: open}, nil
	}
}

// Refiner is implemented by a sink's Config when its file section may
// give a key more precisely than the sink URL can: the webhook's url may
// carry the receiver's own query string, which the sink URL cannot (its
// query holds the sink's options). Refines reports whether fromFile, the
// section's value of key, refines fromURL; the section's value is then
// kept rather than reported as a conflict.
type Refiner interface {
	Refines(key, fromURL, fromFile string) bool
}

// ConflictError is a key that both the sink URL and the sink's
// config-file section set, to different values. Neither wins: one of them
// is a mistake, and which one only the operator knows. Its values are
// shown as logs may show them (secrets as "xxxxx", credentials in URLs
// redacted); when that hides the difference, they are left out.
type ConflictError struct {
	// Scheme is the sink URL's scheme ("amqp").
	Scheme string
	// Key is the key in the section, dotted below its top level
	// ("exchange", "tls.ca_file", "sasl.password").
	Key string
	// URL and Section are the two values, each quoted or formatted, and
	// redacted (a URL shows only its scheme and host). Both are "" when
	// redacting hid the difference.
	URL, Section string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("outbox: %s: %s: the sink URL and the config-file section set different values%s; set it in one place",
		e.Scheme, e.Key, e.Values())
}

// Values says what each place sets, for an error message: ` (sink URL
// "A", section "B")`, or that the values are not shown.
func (e *ConflictError) Values() string {
	if e.URL == "" {
		return " (the values are not shown: they may hold a secret)"
	}
	return fmt.Sprintf(" (sink URL %s, section %s)", e.URL, e.Section)
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

// overlay copies every non-zero exported field of src (from the URL) onto
// dst (from the file section), descending into nested structs (tls,
// sasl), so that a section key the URL does not set survives. A field set
// in both to different values is a conflict, unless refiner accepts
// dst's. prefix is the yaml path of dst ("" or "tls.").
func overlay(dst, src reflect.Value, prefix string, refiner Refiner) *ConflictError {
	for i := 0; i < src.NumField(); i++ {
		field := src.Type().Field(i)
		s, d := src.Field(i), dst.Field(i)
		if field.Anonymous && s.Kind() == reflect.Struct {
			// An embedded struct's keys are its container's (yaml's
			// inline).
			if err := overlay(d, s, prefix, refiner); err != nil {
				return err
			}
			continue
		}
		if !field.IsExported() {
			continue
		}
		key := prefix + yamlKey(field)
		switch {
		case s.IsZero():
		case d.IsZero():
			d.Set(s)
		case s.Kind() == reflect.Struct:
			if err := overlay(d, s, key+".", refiner); err != nil {
				return err
			}
		case reflect.DeepEqual(s.Interface(), d.Interface()):
		case s.Kind() == reflect.String && refiner != nil && refiner.Refines(key, s.String(), d.String()):
		default:
			fromURL, fromFile := shown(s), shown(d)
			if fromURL == fromFile {
				fromURL, fromFile = "", ""
			}
			return &ConflictError{Key: key, URL: fromURL, Section: fromFile}
		}
	}
	return nil
}

// yamlKey is the name of f in a config file: its yaml tag's, else its
// name in lower case (yaml.v3's rule).
func yamlKey(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name != "" && name != "-" {
		return name
	}
	return strings.ToLower(f.Name)
}

// shown formats v for an error: a pointer as what it points to, a URL
// as its scheme and host (a webhook's path or query may hold its token, a
// broker URL a password), another string quoted, anything else as fmt
// shows it (a sinkconf.Secret prints "xxxxx"); all of it through
// redact.URL.
func shown(v reflect.Value) string {
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem() // an optional value (a *bool whose nil means "default")
	}
	if v.Kind() != reflect.String || v.Type().Implements(stringerType) {
		return redact.URL(fmt.Sprint(v.Interface()))
	}
	s := v.String()
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		s = u.Scheme + "://" + u.Host
		if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			s += "/…"
		}
	}
	return strconv.Quote(redact.URL(s))
}

var stringerType = reflect.TypeFor[fmt.Stringer]()

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
