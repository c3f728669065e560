// Package sinkconf holds the configuration plumbing every sink shares:
// Secret, a string that never prints; TLS, the one TLS section of every
// sink that dials a broker, with its URL parameters; Template, a
// destination name built from a message; Params, the table of a sink URL's
// query parameters, which both parses them (an unknown or repeated
// parameter is an error naming it) and renders them back for Redacted,
// and whose Routing parameters make a sink's Target (the destination's
// identity, without tuning or credentials); and the checks and defaults
// of durations (CheckDurations, ReconnectDefaults, CheckReconnect), so
// that every sink words them alike.
//
// It holds no sink and knows no scheme: each sink package declares its
// own table with the parameter names its users write.
package sinkconf

import (
	"log/slog"
	"strconv"
)

// Redacted is what a Secret prints instead of its value.
const Redacted = "xxxxx"

// Secret is a string that never prints: fmt (%v, %+v, %#v, %s), slog and
// JSON or YAML encoding show "xxxxx" instead of the value (and "" for an
// empty secret, so that a missing one stays visible). Decoding from YAML
// or JSON reads the real value.
type Secret string

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return Redacted
}

// GoString implements fmt.GoStringer (%#v).
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler (JSON, slog's JSON handler).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalYAML implements yaml.Marshaler.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }
