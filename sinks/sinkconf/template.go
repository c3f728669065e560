package sinkconf

import (
	"errors"
	"fmt"
	"strings"
)

// Template is a destination name built from a message: literal text plus
// the placeholders {topic}, {key} and {header:NAME} (empty when the
// message has no such header). Sinks use it for a NATS subject or a Redis
// stream key. The zero Template renders the topic.
type Template struct {
	parts []tmplPart
}

type tmplPart struct {
	kind   int // partLiteral, partTopic, partKey, partHeader
	text   string
	header string
}

const (
	partLiteral = iota
	partTopic
	partKey
	partHeader
)

// ParseTemplate parses s. Its error says what is wrong without naming the
// field: callers prefix it ("outbox: nats: subject: ...").
func ParseTemplate(s string) (Template, error) {
	if s == "" {
		return Template{}, errors.New("empty template (use {topic})")
	}
	var t Template
	for s != "" {
		open := strings.IndexByte(s, '{')
		closeIdx := strings.IndexByte(s, '}')
		if closeIdx >= 0 && (open < 0 || closeIdx < open) {
			return Template{}, errors.New(`unmatched "}"`)
		}
		if open < 0 {
			t.parts = append(t.parts, tmplPart{kind: partLiteral, text: s})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, tmplPart{kind: partLiteral, text: s[:open]})
		}
		end := strings.IndexByte(s[open:], '}')
		if end < 0 {
			return Template{}, errors.New(`unmatched "{"`)
		}
		name := s[open+1 : open+end]
		switch {
		case name == "topic":
			t.parts = append(t.parts, tmplPart{kind: partTopic})
		case name == "key":
			t.parts = append(t.parts, tmplPart{kind: partKey})
		case strings.HasPrefix(name, "header:") && len(name) > len("header:") && !strings.Contains(name, "{"):
			t.parts = append(t.parts, tmplPart{kind: partHeader, header: name[len("header:"):]})
		default:
			return Template{}, fmt.Errorf("unknown placeholder {%s} (use {topic}, {key} or {header:NAME})", name)
		}
		s = s[open+end+1:]
	}
	return t, nil
}

// Fixed reports whether the template renders the same name for every
// message (literal text only).
func (t Template) Fixed() bool {
	for _, p := range t.parts {
		if p.kind != partLiteral {
			return false
		}
	}
	return len(t.parts) > 0
}

// UsesKey reports whether the template has a {key} placeholder.
func (t Template) UsesKey() bool {
	for _, p := range t.parts {
		if p.kind == partKey {
			return true
		}
	}
	return false
}

// Render returns the name for a message.
func (t Template) Render(topic, key string, headers map[string]string) string {
	if len(t.parts) == 0 || len(t.parts) == 1 && t.parts[0].kind == partTopic {
		return topic
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.kind {
		case partLiteral:
			b.WriteString(p.text)
		case partTopic:
			b.WriteString(topic)
		case partKey:
			b.WriteString(key)
		case partHeader:
			b.WriteString(headers[p.header])
		}
	}
	return b.String()
}
