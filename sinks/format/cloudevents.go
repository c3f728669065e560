package format

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// SpecVersion is the CloudEvents specification version produced.
const SpecVersion = "1.0"

// Message headers the cloudevents format reads.
const (
	// HeaderType, when set on a message, is its CloudEvents type (else
	// the topic is).
	HeaderType = "type"
	// HeaderContentType, when set on a message (matched
	// case-insensitively), is its datacontenttype.
	HeaderContentType = "content-type"
)

// ceAttrs are the context attributes the format sets, in the order they
// are written. datacontenttype is absent: every binding maps it onto the
// protocol's own content type.
var ceAttrs = []string{"specversion", "id", "source", "type", "time", "subject", "partitionkey", "outboxseq"}

// CloudEvents returns the CloudEvents 1.0 binary-content-mode format for
// opts.Binding. Each message becomes an event with
//
//	id              = the message id
//	source          = opts.Source
//	specversion     = 1.0
//	type            = the message's "type" header, else its topic
//	time            = the message's CreatedAt (RFC 3339, UTC)
//	subject         = the key, when the message has one
//	partitionkey    = the key, when the message has one (Partitioning
//	                  extension)
//	outboxseq       = the message's position (sinks.Message.Seq, the
//	                  outbox row's id) in decimal (extension attribute):
//	                  a key's events carry growing positions in the
//	                  order they were written, which consumers (the
//	                  inbox package) use to tell a late redelivery
//	                  from a new event
//	datacontenttype = the message's "content-type" header, when set
//
// and data = the payload, unchanged. The application's other headers are
// kept; a header whose name is one of the event's attribute headers is
// replaced.
func CloudEvents(opts Options) (Format, error) {
	f := &cloudEvents{source: opts.Source}
	if f.source == "" {
		f.source = DefaultSource
	}
	if err := validSource(f.source); err != nil {
		return nil, fmt.Errorf("outbox: format: cloudevents-source: %w", err)
	}
	switch opts.Binding {
	case BindingKafka:
		f.prefix = "ce_"
		// datacontenttype travels in the content-type header.
		f.drop = []string{"ce_datacontenttype"}
	case BindingHTTP, BindingNATS:
		f.prefix = "ce-"
		f.percent = true
		// The binding forbids ce-datacontenttype next to Content-Type.
		f.drop = []string{"ce-datacontenttype"}
	case BindingAMQP:
		switch opts.AMQPPrefix {
		case "", AMQPPrefixUnderscore:
			f.prefix = AMQPPrefixUnderscore
		case AMQPPrefixColon:
			f.prefix = AMQPPrefixColon
		default:
			return nil, fmt.Errorf("outbox: format: cloudevents-amqp-prefix: must be %q or %q, got %q", AMQPPrefixUnderscore, AMQPPrefixColon, opts.AMQPPrefix)
		}
		// One message must use one separator for all attributes: drop the
		// other spelling of ours, and datacontenttype, which travels in the
		// content-type property.
		other := AMQPPrefixColon
		if f.prefix == AMQPPrefixColon {
			other = AMQPPrefixUnderscore
		}
		for _, a := range ceAttrs {
			f.drop = append(f.drop, other+a)
		}
		f.drop = append(f.drop, AMQPPrefixUnderscore+"datacontenttype", AMQPPrefixColon+"datacontenttype")
	case "":
		return nil, fmt.Errorf("outbox: format: binding: required for cloudevents (one of %s)", bindingList())
	default:
		return nil, fmt.Errorf("outbox: format: binding: unknown binding %q (want one of %s)", opts.Binding, bindingList())
	}
	for _, a := range ceAttrs {
		f.names = append(f.names, f.prefix+a)
	}
	f.replaced = make(map[string]bool)
	for _, n := range append(slices.Clone(f.names), f.drop...) {
		f.replaced[strings.ToLower(n)] = true
	}
	return f, nil
}

func bindingList() string {
	s := make([]string, len(Bindings))
	for i, b := range Bindings {
		s[i] = string(b)
	}
	return strings.Join(s, ", ")
}

type cloudEvents struct {
	source  string
	prefix  string
	percent bool     // HTTP: percent-encode attribute values
	names   []string // header name of each of ceAttrs
	drop    []string // application headers removed besides names
	// replaced holds the lower-cased names of names and drop: application
	// headers equal to one of them, ignoring case, are removed (HTTP
	// header names are case-insensitive, and consumers differ for Kafka
	// and AMQP).
	replaced map[string]bool
}

func (f *cloudEvents) Name() string { return NameCloudEvents }

func (f *cloudEvents) Encode(m sinks.Message) (sinks.Message, error) {
	if m.ID == "" {
		return m, errors.New("cloudevents: id: the message has no id")
	}
	typ := m.Headers[HeaderType]
	if typ == "" {
		typ = m.Topic
	}
	if typ == "" {
		return m, errors.New("cloudevents: type: the message has neither a type header nor a topic")
	}
	var ts string
	if !m.CreatedAt.IsZero() {
		ts = m.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	values := [...]string{SpecVersion, m.ID, f.source, typ, ts, m.Key, m.Key, strconv.FormatInt(m.Seq, 10)}

	h := make(map[string]string, len(m.Headers)+len(values))
	var contentType, ctName string
	for k, v := range m.Headers {
		lk := lowerASCII(k)
		if f.replaced[lk] {
			continue
		}
		if lk == HeaderContentType {
			// Keep one content-type header, spelled the way the Kafka
			// binding names it (HTTP and the AMQP sink match it
			// case-insensitively). With several spellings the exact one
			// wins, then the first in byte order, so the choice is stable.
			if ctName == "" || k == HeaderContentType || (ctName != HeaderContentType && k < ctName) {
				ctName, contentType = k, v
			}
			continue
		}
		h[k] = v
	}
	if ctName != "" {
		h[HeaderContentType] = contentType
	}
	for i, name := range f.names {
		v := values[i]
		if v == "" {
			continue // optional attribute without a value: absent
		}
		if f.percent {
			v = percentEncode(v)
		}
		h[name] = v
	}
	m.Headers = h
	return m, nil
}

// percentEncode encodes an attribute value for an HTTP header as the
// CloudEvents HTTP binding requires: space, double quote, percent and
// every character outside printable ASCII (U+0021-U+007E) become %XY per
// UTF-8 byte, with upper-case hex digits. Invalid UTF-8 bytes are encoded
// as they are.
func percentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// needsEscape works per byte: every byte of a multi-byte UTF-8 sequence is
// >= 0x80 and so escaped, which is exactly "encode the character as UTF-8,
// then each byte as %XY".
func needsEscape(c byte) bool {
	return c <= 0x20 || c >= 0x7f || c == '"' || c == '%'
}

// lowerASCII lower-cases ASCII letters, allocating only when k has upper
// case ones (header names are nearly always lower case already).
func lowerASCII(k string) string {
	for i := 0; i < len(k); i++ {
		if c := k[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(k)
		}
	}
	return k
}
