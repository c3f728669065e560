package sinkconf

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// Param is one query parameter of a sink URL: how to set it on a config C
// and how to show it again. Build one with String, Int, Bool, Duration,
// Secrets or Func.
type Param[C any] struct {
	name string
	// set applies the parameter's values (one unless repeat); its error
	// says what is wrong with the value, without the parameter's name.
	set func(c *C, vals []string) error
	// get returns the values to show (none when unset), secrets redacted.
	get    func(c *C) []string
	repeat bool
	// routing: the parameter is part of the destination's identity (see
	// Routing and Params.Target).
	routing bool
}

// Params is a sink's table of URL query parameters.
type Params[C any] struct {
	sink   string
	hint   string
	params []Param[C]
}

// NewParams returns the table of sink (the name in errors: "kafka"). hint,
// if any, ends the error about an unknown parameter.
func NewParams[C any](sink, hint string, params ...Param[C]) Params[C] {
	return Params[C]{sink: sink, hint: hint, params: params}
}

// With returns the table with more parameters at its end (TLSParams).
func (p Params[C]) With(more ...Param[C]) Params[C] {
	p.params = append(slices.Clip(p.params), more...)
	return p
}

// Names returns the parameter names, in table order.
func (p Params[C]) Names() []string {
	names := make([]string, len(p.params))
	for i, pr := range p.params {
		names[i] = pr.name
	}
	return names
}

// Parse sets c from a raw query string. Each parameter may appear once
// (unless it repeats by nature); any parameter not in the table is an
// error naming it. Values in errors go through redact.URL.
func (p Params[C]) Parse(c *C, rawQuery string) error {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		// The error quotes the bad escape, which may be part of a secret.
		return fmt.Errorf("outbox: %s: malformed query string in the sink URL (percent-encode reserved characters)", p.sink)
	}
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	slices.Sort(names) // the same error for the same URL
	for _, name := range names {
		i := slices.IndexFunc(p.params, func(pr Param[C]) bool { return pr.name == name })
		if i < 0 {
			return fmt.Errorf("outbox: %s: unknown sink URL parameter %q%s", p.sink, name, p.hint)
		}
		pr, vals := p.params[i], q[name]
		if len(vals) != 1 && !pr.repeat {
			return fmt.Errorf("outbox: %s: sink URL parameter %q given %d times", p.sink, name, len(vals))
		}
		if err := pr.set(c, vals); err != nil {
			return fmt.Errorf("outbox: %s: sink URL parameter %q: %w", p.sink, name, err)
		}
	}
	return nil
}

// ParseURL parses a sink URL: its query sets a C as Parse does, and base
// is the URL without the query (what the sink connects to). The caller
// sets base in the config and validates it.
func (p Params[C]) ParseURL(raw string) (c C, base string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url's error quotes the URL, password included.
		return c, "", fmt.Errorf(`outbox: %s: url: not a valid URL (percent-encode reserved characters such as "?", "#", "@", "/" in the user name and password)`, p.sink)
	}
	if err := p.Parse(&c, u.RawQuery); err != nil {
		return c, "", err
	}
	u.RawQuery = ""
	u.ForceQuery = false
	return c, u.String(), nil
}

// Validator is a sink's Config: it says what is wrong with itself.
type Validator interface{ Validate() error }

// ParseConfig is a sink's ParseURL: DecodeURL, then the result
// validated.
func ParseConfig[C Validator](p Params[C], raw string, setBase func(c *C, base string) error) (C, error) {
	c, err := DecodeURL(p, raw, setBase)
	if err != nil {
		var zero C
		return zero, err
	}
	if err := c.Validate(); err != nil {
		var zero C
		return zero, err
	}
	return c, nil
}

// DecodeURL reads what a sink URL says, without validating it: it parses
// raw's query as p.ParseURL does (every Config field under its yaml name,
// TLS fields as TLSParams names them; any other parameter is an error
// naming it) and hands the URL without its query to setBase (which puts
// it in the config, or refuses it). A sink's driver decodes this way
// (see sinks.Typed): a key the URL leaves out may come from the config
// file, and only the two together can be validated.
func DecodeURL[C any](p Params[C], raw string, setBase func(c *C, base string) error) (C, error) {
	var zero C
	c, base, err := p.ParseURL(raw)
	if err != nil {
		return zero, err
	}
	if err := setBase(&c, base); err != nil {
		return zero, err
	}
	return c, nil
}

// Query returns c's parameters that are set, secrets redacted: the query
// of the sink's Redacted URL.
func (p Params[C]) Query(c *C) url.Values {
	q := url.Values{}
	for _, pr := range p.params {
		for _, v := range pr.get(c) {
			q.Add(pr.name, v)
		}
	}
	return q
}

func one[C any](name string, set func(c *C, v string) error, get func(c *C) string) Param[C] {
	return Param[C]{
		name: name,
		set:  func(c *C, vals []string) error { return set(c, vals[0]) },
		get: func(c *C) []string {
			if v := get(c); v != "" {
				return []string{v}
			}
			return nil
		},
	}
}

// Func is a parameter with its own syntax: set parses a value (its error
// says what is wrong, without the parameter name), get shows the field
// ("" when unset).
func Func[C any](name string, set func(c *C, v string) error, get func(c *C) string) Param[C] {
	return one(name, set, get)
}

// String is a text parameter.
func String[C any](name string, field func(c *C) *string) Param[C] {
	return scalar(name, field, func(v string) (string, error) { return v, nil }, "", func(v string) string { return v })
}

// Int is an integer parameter; 0 is unset.
func Int[C any](name string, field func(c *C) *int) Param[C] {
	return scalar(name, field, strconv.Atoi, "an integer", strconv.Itoa)
}

// Float is a decimal number parameter ("12.5"); 0 is unset.
func Float[C any](name string, field func(c *C) *float64) Param[C] {
	return scalar(name, field, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }, "a number",
		func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) })
}

// Bool is a boolean parameter (strconv.ParseBool's spellings); false is
// unset.
func Bool[C any](name string, field func(c *C) *bool) Param[C] {
	return scalar(name, field, strconv.ParseBool, "true or false", strconv.FormatBool)
}

// Duration is a Go duration parameter ("10s"); 0 is unset.
func Duration[C any](name string, field func(c *C) *time.Duration) Param[C] {
	return scalar(name, field, time.ParseDuration, "a duration such as 10s", time.Duration.String)
}

// scalar is a parameter held in one field of type T, whose zero value
// means unset. want names the syntax in errors ("an integer").
func scalar[C any, T comparable](name string, field func(c *C) *T, parse func(string) (T, error), want string, format func(T) string) Param[C] {
	return one(name,
		func(c *C, v string) error {
			x, err := parse(v)
			if err != nil {
				// parse's own error quotes the value unredacted.
				return fmt.Errorf("%q is not %s", redact.URL(v), want)
			}
			*field(c) = x
			return nil
		},
		func(c *C) string {
			var zero T
			if x := *field(c); x != zero {
				return format(x)
			}
			return ""
		})
}

// Secrets is a parameter that may repeat, each value a secret: it shows
// as "xxxxx" once per value.
func Secrets[C any](name string, field func(c *C) *[]Secret) Param[C] {
	return Param[C]{
		name:   name,
		repeat: true,
		set: func(c *C, vals []string) error {
			for _, v := range vals {
				*field(c) = append(*field(c), Secret(v))
			}
			return nil
		},
		get: func(c *C) []string {
			out := make([]string, len(*field(c)))
			for i := range out {
				out[i] = Redacted
			}
			return out
		},
	}
}
