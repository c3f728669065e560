package format

import "github.com/outbox-relay/outbox-relay/sinks"

// HeaderDebeziumID is the header Debezium's outbox event router puts the
// event id in (table.field.event.id, default column "id").
const HeaderDebeziumID = "id"

// Debezium is the format compatible with the defaults of Debezium's outbox
// event router (io.debezium.transforms.outbox.EventRouter), so consumers
// can switch from Debezium to outbox-relay without changes:
//
//	record key   = the message key (Debezium: aggregateid)
//	record value = the payload, byte for byte (Debezium: payload)
//	header "id"  = the message id (Debezium: id)
//
// The application's other headers are kept (Debezium places extra columns
// as headers with table.fields.additional.placement); an application
// header named "id" is replaced. The topic is the outbox topic: write
// "outbox.event.<aggregatetype>", or map topics with the Kafka sink's
// topic_map or topic_prefix, to get Debezium's topic names. See
// docs/formats.md.
var Debezium Format = debezium{}

type debezium struct{}

func (debezium) Name() string { return NameDebezium }

func (debezium) Encode(m sinks.Message) (sinks.Message, error) {
	h := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderDebeziumID] = m.ID
	m.Headers = h
	return m, nil
}
