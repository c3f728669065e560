// Package wire owns the names under which the relay's sinks carry a
// message's identity to consumers (headers, attributes, properties or
// stream fields, as the transport calls them), and under which the inbox
// adapters read it back. Sinks and adapters refer to these constants;
// no other package spells the names. docs/sinks/ says, sink by sink,
// which of them each transport carries.
package wire

const (
	// ID carries the message id (a UUID, the same at every attempt) where
	// the transport has no message-id field of its own (MQTT, Pub/Sub,
	// SQS, SNS).
	ID = "outbox-id"
	// MessageID carries the message id on Kafka records.
	MessageID = "outbox-message-id"
	// Seq carries the message's position in its outbox: its row id, which
	// only grows per key, comparable only with positions of the same
	// outbox (see Producer).
	Seq = "outbox-seq"
	// Key carries the message's key where the transport has no key of its
	// own (AMQP, HTTP, MQTT, NATS, Pub/Sub, SQS, SNS); absent for a message
	// without one.
	Key = "outbox-key"
	// Topic carries the message's topic on webhook requests.
	Topic = "outbox-topic"
	// Producer names the outbox a message comes from (the relay's
	// --producer), so that a consumer of several outboxes orders each
	// key per producer.
	Producer = "outbox-producer"
)
