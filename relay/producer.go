package relay

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/sinks"
)

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

// resolveProducer sets the name the relay adds to its messages (see
// Config.Producer), reading the default from the database. A fan-out
// router publishes nothing: its destinations' relays name the messages.
func (r *Relay) resolveProducer(ctx context.Context) error {
	p := r.cfg.Producer
	switch {
	case p == ProducerNone || r.cfg.Router():
		return nil
	case p == "":
		err := r.atStart(ctx, func() error {
			database, systemID, err := store.ProducerOrigin(ctx, r.pool)
			p = defaultProducer(database, systemID, r.cfg.Schema)
			return err
		})
		if err != nil {
			return fmt.Errorf("outbox: producer: read the default name: %w", err)
		}
	}
	r.producer = p
	// Messages without headers of their own (most) share this map, so
	// naming the producer allocates nothing per message: sinks and
	// formats read a message's Headers and never write them.
	r.producerHeaders = map[string]string{sinks.HeaderProducer: p}
	return nil
}

// named returns h with the relay's producer name added, unless the
// application named one itself (any case of the header's name: on HTTP
// two spellings would be one header with two values).
func (r *Relay) named(h map[string]string) map[string]string {
	if r.producer == "" {
		return h
	}
	if len(h) == 0 {
		return r.producerHeaders
	}
	if _, ok := h[sinks.HeaderProducer]; ok {
		return h
	}
	for k := range h {
		if strings.EqualFold(k, sinks.HeaderProducer) {
			return h
		}
	}
	h[sinks.HeaderProducer] = r.producer
	return h
}
