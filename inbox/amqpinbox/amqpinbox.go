// Package amqpinbox connects a rabbitmq/amqp091-go consumer to the inbox:
// Message takes the inbox message (id, key, position) from a delivery,
// and Handle runs the delivery's handler in a database transaction with
// the inbox and acknowledges the delivery only after that transaction
// committed.
//
// A consumer that dies between its commit and its ack gets the delivery
// again (redelivered by the broker to it or to another consumer of the
// queue), and the inbox skips it as a duplicate.
package amqpinbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The headers the relay's AMQP sink sets besides the message-id property
// (sinks/amqpsink).
const (
	HeaderKey = wire.Key
	HeaderSeq = wire.Seq
	// HeaderProducer names the outbox the message comes from
	// (inbox.HeaderProducer): positions are compared per producer.
	HeaderProducer = inbox.HeaderProducer
)

// ErrNoID is returned for a delivery without a message-id (not published
// by the relay).
var ErrNoID = errors.New("outbox: amqpinbox: delivery has no message-id")

// Message returns the inbox message of d: id = the message-id property,
// key = the outbox-key header, position = the outbox-seq header (an AMQP
// long; a decimal string is accepted too; 0 when absent), producer = the
// outbox-producer header ("" when absent).
func Message(d amqp.Delivery) (inbox.Message, error) {
	m := inbox.Message{ID: d.MessageId}
	if m.ID == "" {
		return m, ErrNoID
	}
	if k, ok := d.Headers[HeaderKey].(string); ok {
		m.Key = k
	}
	if p, ok := d.Headers[HeaderProducer].(string); ok {
		m.Producer = p
	}
	switch v := d.Headers[HeaderSeq].(type) {
	case nil:
	case int64:
		m.Seq = v
	case int32:
		m.Seq = int64(v)
	case string:
		seq, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return m, fmt.Errorf("outbox: amqpinbox: %s header %q: %w", HeaderSeq, v, err)
		}
		m.Seq = seq
	default:
		return m, fmt.Errorf("outbox: amqpinbox: %s header of type %T", HeaderSeq, v)
	}
	return m, nil
}

// Handle runs fn for d through the inbox in a transaction on db and acks
// d after the commit (a duplicate is acked without running fn). When it
// fails (d lacks a message-id, fn fails, d is out of order: an
// *inbox.OutOfOrderError) it nacks d with requeue, so the broker delivers
// it again, and returns the error. Give the queue a delivery limit and a
// dead-letter exchange so a message that always fails leaves the queue.
func Handle(ctx context.Context, in *inbox.Inbox, db inbox.Beginner, d amqp.Delivery, fn func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error) (inbox.Outcome, error) {
	m, err := Message(d)
	if err == nil {
		var o inbox.Outcome
		o, err = in.Run(ctx, db, m, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, d) })
		if err == nil {
			if err := d.Ack(false); err != nil {
				return o, fmt.Errorf("outbox: amqpinbox: ack %s (processed; it comes again as a duplicate): %w", m.ID, err)
			}
			return o, nil
		}
	}
	if nerr := d.Nack(false, true); nerr != nil {
		err = errors.Join(err, fmt.Errorf("outbox: amqpinbox: nack: %w", nerr))
	}
	return 0, err
}
