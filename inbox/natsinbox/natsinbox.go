// Package natsinbox connects a NATS JetStream consumer (nats.go's
// jetstream package) to the inbox: Message takes the inbox message (id,
// key, position) from a message, and Handle runs the message's handler in
// a database transaction with the inbox and acknowledges the message only
// after that transaction committed.
//
// A consumer that dies between its commit and its ack gets the message
// again after the ack wait, and the inbox skips it as a duplicate.
package natsinbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The headers the relay's NATS sink sets (sinks/natssink).
const (
	HeaderMsgID = "Nats-Msg-Id"
	HeaderKey   = wire.Key
	HeaderSeq   = wire.Seq
	// HeaderProducer names the outbox the message comes from
	// (inbox.HeaderProducer): positions are compared per producer.
	HeaderProducer = inbox.HeaderProducer
)

// ErrNoID is returned for a message without Nats-Msg-Id (not published by
// the relay).
var ErrNoID = errors.New("outbox: natsinbox: message has no Nats-Msg-Id header")

// Message returns the inbox message of msg: id = Nats-Msg-Id, key =
// outbox-key, position = outbox-seq (0 when absent), producer =
// outbox-producer ("" when absent).
func Message(msg jetstream.Msg) (inbox.Message, error) {
	h := msg.Headers()
	m := inbox.Message{ID: h.Get(HeaderMsgID), Key: h.Get(HeaderKey), Producer: h.Get(HeaderProducer)}
	if m.ID == "" {
		return m, ErrNoID
	}
	if s := h.Get(HeaderSeq); s != "" {
		seq, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return m, fmt.Errorf("outbox: natsinbox: %s header %q: %w", HeaderSeq, s, err)
		}
		m.Seq = seq
	}
	return m, nil
}

// Handle runs fn for msg through the inbox in a transaction on db and
// acks msg after the commit, waiting for the server to confirm the ack
// (DoubleAck); a duplicate is acked without running fn. When it fails
// (no id, fn fails, msg is out of order: an *inbox.OutOfOrderError) it
// naks msg, so the server delivers it again, and returns the error. Set
// the consumer's MaxDeliver so a message that always fails stops.
func Handle(ctx context.Context, in *inbox.Inbox, db inbox.Beginner, msg jetstream.Msg, fn func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error) (inbox.Outcome, error) {
	m, err := Message(msg)
	if err == nil {
		var o inbox.Outcome
		o, err = in.Run(ctx, db, m, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, msg) })
		if err == nil {
			if err := msg.DoubleAck(ctx); err != nil {
				return o, fmt.Errorf("outbox: natsinbox: ack %s (processed; it comes again as a duplicate): %w", m.ID, err)
			}
			return o, nil
		}
	}
	if nerr := msg.Nak(); nerr != nil {
		err = errors.Join(err, fmt.Errorf("outbox: natsinbox: nak: %w", nerr))
	}
	return 0, err
}
