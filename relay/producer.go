package relay

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// ProducerNone (Config.Producer) sends no outbox-producer header: for
// consumers that know their producers otherwise, or wire formats that
// carry few headers.
const ProducerNone = "-"

// maxProducer bounds Config.Producer: it travels with every message.
const maxProducer = 255

// checkProducer reports what is wrong with an explicit Config.Producer
// ("" and ProducerNone are not names). Printable ASCII travels unchanged
// in every sink's headers or attributes (HTTP, NATS, SQS, MQTT ...); a
// space at an end does not survive HTTP.
func checkProducer(p string) error {
	if p == "" || p == ProducerNone {
		return nil
	}
	if len(p) > maxProducer {
		return fmt.Errorf("%d bytes, at most %d", len(p), maxProducer)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] > 0x7e {
			return fmt.Errorf("%q: printable ASCII only", p)
		}
	}
	if strings.TrimSpace(p) != p {
		return fmt.Errorf("%q: a space at either end does not survive every header", p)
	}
	return nil
}

// defaultProducer is Config.Producer's default for the outbox in schema:
// the cluster's system identifier, the database and the schema (see
// Config.Producer). The names are percent-encoded so that the value is
// printable ASCII and its "/" separators unambiguous.
func defaultProducer(database, systemID, schema string) string {
	name := url.PathEscape(database) + "/" + url.PathEscape(schema)
	if systemID != "" {
		name = systemID + "/" + name
	}
	return name
}

// producer is the name a relay adds to its messages' headers (see
// Config.Producer): the zero producer adds none.
type producer struct {
	name string
	// headers are those of a message without headers of its own (most):
	// they share this map, so naming the producer allocates nothing per
	// message; sinks and formats read a message's Headers and never
	// write them.
	headers map[string]string
}

// resolveProducer returns the producer for the outbox in schema named
// explicit (Config.Producer), reading the default from the database q is
// connected to. A fan-out router (router) publishes nothing: its
// destinations' relays name the messages.
func resolveProducer(ctx context.Context, q store.Querier, explicit, schema string, router bool) (producer, error) {
	name := explicit
	switch {
	case name == ProducerNone || router:
		return producer{}, nil
	case name == "":
		database, systemID, err := store.ProducerOrigin(ctx, q)
		if err != nil {
			return producer{}, fmt.Errorf("outbox: producer: read the default name: %w", err)
		}
		name = defaultProducer(database, systemID, schema)
	}
	return producer{name: name, headers: map[string]string{sinks.HeaderProducer: name}}, nil
}

// named returns h with the producer's name added, unless the application
// named one itself (any case of the header's name: on HTTP two spellings
// would be one header with two values).
func (p producer) named(h map[string]string) map[string]string {
	if p.name == "" {
		return h
	}
	if len(h) == 0 {
		return p.headers
	}
	if _, ok := h[sinks.HeaderProducer]; ok {
		return h
	}
	for k := range h {
		if strings.EqualFold(k, sinks.HeaderProducer) {
			return h
		}
	}
	h[sinks.HeaderProducer] = p.name
	return h
}
