package format_test

// A receiver's view of CloudEvents binary content mode, written from the
// protocol binding specifications (cloudevents/spec v1.0.x, bindings/
// kafka-, http- and amqp-protocol-binding.md) and the core spec's rules on
// attributes. Tests decode what the real backends delivered with it, so a
// header misnamed, missing, duplicated or wrongly encoded fails them.

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// event is a decoded CloudEvent: context attributes by name, and data.
type event struct {
	attrs map[string]string
	data  []byte
}

type header struct{ name, value string }

var attrName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

func (e *event) set(name, value string) error {
	if !attrName.MatchString(name) {
		return fmt.Errorf("attribute name %q: must be 1-20 lower-case letters or digits", name)
	}
	if _, dup := e.attrs[name]; dup {
		return fmt.Errorf("attribute %q given twice", name)
	}
	e.attrs[name] = value
	return nil
}

// isStructured reports whether a content type announces the structured
// content mode (then the message is not binary mode).
func isStructured(ct string) bool {
	return strings.HasPrefix(strings.ToLower(ct), "application/cloudevents")
}

// decodeKafka decodes a Kafka record in binary content mode: every ce_
// header is an attribute, content-type is datacontenttype.
func decodeKafka(headers []header, value []byte) (event, error) {
	ev := event{attrs: map[string]string{}, data: value}
	for _, h := range headers {
		if !utf8.ValidString(h.name) || !utf8.ValidString(h.value) {
			return ev, fmt.Errorf("header %q: not UTF-8", h.name)
		}
		switch {
		case h.name == "content-type":
			if isStructured(h.value) {
				return ev, errors.New("structured mode content type")
			}
			if err := ev.set("datacontenttype", h.value); err != nil {
				return ev, err
			}
		case strings.HasPrefix(h.name, "ce_"):
			if err := ev.set(strings.TrimPrefix(h.name, "ce_"), h.value); err != nil {
				return ev, err
			}
		}
	}
	return ev, validate(ev)
}

// decodeHTTP decodes an HTTP request in binary content mode: ce- headers
// (any case) are attributes, their values unquoted then percent-decoded;
// Content-Type is datacontenttype and ce-datacontenttype must be absent.
func decodeHTTP(h http.Header, body []byte) (event, error) {
	ev := event{attrs: map[string]string{}, data: body}
	for name, vs := range h {
		lname := strings.ToLower(name)
		if !strings.HasPrefix(lname, "ce-") {
			continue
		}
		if lname == "ce-datacontenttype" {
			return ev, errors.New("ce-datacontenttype present in binary mode")
		}
		if len(vs) != 1 {
			return ev, fmt.Errorf("header %s: %d values", name, len(vs))
		}
		v, err := httpAttrValue(vs[0])
		if err != nil {
			return ev, fmt.Errorf("header %s: %w", name, err)
		}
		if err := ev.set(strings.TrimPrefix(lname, "ce-"), v); err != nil {
			return ev, err
		}
	}
	if cts := h.Values("Content-Type"); len(cts) > 0 {
		if len(cts) > 1 {
			return ev, errors.New("several Content-Type headers")
		}
		if isStructured(cts[0]) {
			return ev, errors.New("structured mode content type")
		}
		if err := ev.set("datacontenttype", cts[0]); err != nil {
			return ev, err
		}
	}
	return ev, validate(ev)
}

// httpAttrValue undoes the HTTP binding's header value encoding: an
// RFC 7230 quoted string is unquoted first, then one round of
// percent-decoding, whose result must be valid UTF-8.
func httpAttrValue(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		for i := 1; i < len(v)-1; i++ {
			if v[i] == '\\' && i+1 < len(v)-1 {
				i++
			}
			b.WriteByte(v[i])
		}
		v = b.String()
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("raw byte %#x: must be percent-encoded", c)
		}
	}
	d, err := url.PathUnescape(v)
	if err != nil {
		return "", err
	}
	if !utf8.ValidString(d) {
		return "", errors.New("percent-decoded value is not valid UTF-8")
	}
	return d, nil
}

// decodeAMQP decodes an AMQP message in binary content mode: application
// properties prefixed cloudEvents_ or cloudEvents: are attributes (one
// separator per message), the content-type property is datacontenttype.
func decodeAMQP(props map[string]any, contentType string, body []byte) (event, error) {
	ev := event{attrs: map[string]string{}, data: body}
	sep := byte(0)
	for name, raw := range props {
		if !strings.HasPrefix(name, "cloudEvents") || len(name) <= len("cloudEvents_") {
			continue
		}
		s := name[len("cloudEvents")]
		if s != '_' && s != ':' {
			continue
		}
		if sep != 0 && s != sep {
			return ev, errors.New("both cloudEvents_ and cloudEvents: used in one message")
		}
		sep = s
		var v string
		switch x := raw.(type) {
		case string:
			v = x
		case time.Time:
			v = x.UTC().Format(time.RFC3339Nano)
		default:
			return ev, fmt.Errorf("property %s: unexpected type %T", name, raw)
		}
		an := name[len("cloudEvents_"):]
		if an == "datacontenttype" {
			return ev, errors.New("datacontenttype must travel in the content-type property")
		}
		if err := ev.set(an, v); err != nil {
			return ev, err
		}
	}
	if contentType != "" {
		if isStructured(contentType) {
			return ev, errors.New("structured mode content type")
		}
		if err := ev.set("datacontenttype", contentType); err != nil {
			return ev, err
		}
	}
	return ev, validate(ev)
}

// validate applies the core specification's rules to the attributes the
// format produces: required ones present and non-empty, types parse.
func validate(ev event) error {
	var errs []error
	for _, req := range []string{"id", "source", "specversion", "type"} {
		if ev.attrs[req] == "" {
			errs = append(errs, fmt.Errorf("required attribute %q missing or empty", req))
		}
	}
	if v, ok := ev.attrs["specversion"]; ok && v != "1.0" {
		errs = append(errs, fmt.Errorf("specversion %q, want 1.0", v))
	}
	if v, ok := ev.attrs["source"]; ok {
		if _, err := url.Parse(v); err != nil {
			errs = append(errs, fmt.Errorf("source %q: not a URI-reference: %v", v, err))
		}
	}
	if v, ok := ev.attrs["time"]; ok {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			errs = append(errs, fmt.Errorf("time %q: not RFC 3339: %v", v, err))
		}
	}
	if v, ok := ev.attrs["datacontenttype"]; ok {
		if _, _, err := mime.ParseMediaType(v); err != nil {
			errs = append(errs, fmt.Errorf("datacontenttype %q: %v", v, err))
		}
	}
	for _, opt := range []string{"subject", "partitionkey"} {
		if v, ok := ev.attrs[opt]; ok && v == "" {
			errs = append(errs, fmt.Errorf("%s present but empty", opt))
		}
	}
	return errors.Join(errs...)
}

// kafkaHeaders turns a header map into Kafka headers (the sink sorts them).
func kafkaHeaders(m map[string]string) []header {
	out := make([]header, 0, len(m))
	for k, v := range m {
		out = append(out, header{k, v})
	}
	return out
}

func httpHeader(m map[string]string) http.Header {
	h := http.Header{}
	for k, v := range m {
		h.Add(k, v)
	}
	return h
}

func amqpProps(m map[string]string) (map[string]any, string) {
	p := map[string]any{}
	ct := ""
	for k, v := range m {
		if strings.EqualFold(k, "content-type") {
			ct = v
		}
		p[k] = v
	}
	return p, ct
}
