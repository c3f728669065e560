// Package ceinbox takes the inbox message (id, key, position, producer)
// from a CloudEvent, for consumers that read the relay's events with the
// CloudEvents format (--format cloudevents) through a CloudEvents SDK or
// binding: id = the event's id, key = its partitionkey extension (else
// its subject), position = its outboxseq extension. The producer is not
// an attribute: the relay sends it as a plain transport header
// (outbox-producer, beside the ce- ones), which HTTP and Kafka read and
// Message leaves to its caller. It needs no CloudEvents library: give it
// the attribute lookup of whatever event type you have.
//
// It answers nothing itself. A receiver of the relay's webhooks that
// fails on an event (its handler, an *inbox.OutOfOrderError) answers as
// package httpinbox does: 500 with the header Outbox-Failure: message, so
// that the relay retries that event and dead-letters it after its
// attempts; a 503, or a 5xx without that header, tells the relay the
// receiver may be down, and it asks the receiver before it counts an
// attempt.
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

// HeaderProducer is the transport header (not an attribute) that names
// the outbox an event comes from (inbox.HeaderProducer).
const HeaderProducer = inbox.HeaderProducer

// ErrNoID is returned for an event without an id.
var ErrNoID = errors.New("outbox: ceinbox: event has no id")

// Message returns the inbox message of an event whose attributes attr
// returns by name ("" when absent), without a producer: set Producer from
// the transport's outbox-producer header. With the Go SDK:
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
// request (ce- headers, values percent-decoded as the binding requires;
// the producer from outbox-producer).
func HTTP(h http.Header) (inbox.Message, error) {
	m, err := Message(func(a string) string {
		v, err := url.PathUnescape(h.Get("ce-" + a))
		if err != nil {
			return h.Get("ce-" + a)
		}
		return v
	})
	m.Producer = h.Get(HeaderProducer)
	return m, err
}

// Kafka returns the inbox message of a binary-mode CloudEvents Kafka
// record whose headers header returns by name (ce_ prefixed; the producer
// from outbox-producer).
func Kafka(header func(name string) string) (inbox.Message, error) {
	m, err := Message(func(a string) string { return header("ce_" + a) })
	m.Producer = header(HeaderProducer)
	return m, err
}
