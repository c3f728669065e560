// Package ceinbox takes the inbox message (id, key, position) from a
// CloudEvent, for consumers that read the relay's events with the
// CloudEvents format (--format cloudevents) through a CloudEvents SDK or
// binding: id = the event's id, key = its partitionkey extension (else
// its subject), position = its outboxseq extension. It needs no
// CloudEvents library: give it the attribute lookup of whatever event
// type you have.
package ceinbox

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/outbox-relay/outbox-relay/inbox"
)

// The attributes read.
const (
	AttrID           = "id"
	AttrPartitionKey = "partitionkey"
	AttrSubject      = "subject"
	AttrSeq          = "outboxseq"
)

// ErrNoID is returned for an event without an id.
var ErrNoID = errors.New("outbox: ceinbox: event has no id")

// Message returns the inbox message of an event whose attributes attr
// returns by name ("" when absent). With the Go SDK:
//
//	ceinbox.Message(func(a string) string {
//		switch a {
//		case "id":
//			return ev.ID()
//		case "subject":
//			return ev.Subject()
//		}
//		v, _ := types.ToString(ev.Extensions()[a])
//		return v
//	})
func Message(attr func(name string) string) (inbox.Message, error) {
	m := inbox.Message{ID: attr(AttrID), Key: attr(AttrPartitionKey)}
	if m.ID == "" {
		return m, ErrNoID
	}
	if m.Key == "" {
		m.Key = attr(AttrSubject)
	}
	if s := attr(AttrSeq); s != "" {
		seq, err := strconv.ParseInt(s, 10, 64)
		if err != nil || seq < 0 {
			return m, fmt.Errorf("outbox: ceinbox: %s %q is not a position", AttrSeq, s)
		}
		m.Seq = seq
	}
	return m, nil
}

// HTTP returns the inbox message of a binary-mode CloudEvents HTTP
// request (ce- headers, values percent-decoded as the binding requires).
func HTTP(h http.Header) (inbox.Message, error) {
	return Message(func(a string) string {
		v, err := url.PathUnescape(h.Get("ce-" + a))
		if err != nil {
			return h.Get("ce-" + a)
		}
		return v
	})
}

// Kafka returns the inbox message of a binary-mode CloudEvents Kafka
// record whose headers header returns by name (ce_ prefixed).
func Kafka(header func(name string) string) (inbox.Message, error) {
	return Message(func(a string) string { return header("ce_" + a) })
}
