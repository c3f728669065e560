// Package redisinbox connects a Redis Streams consumer group (go-redis
// v9) to the inbox: Message takes the inbox message (id, key, position)
// from a stream entry, and Handle runs the entry's handler in a database
// transaction with the inbox and acknowledges the entry (XACK) only after
// that transaction committed.
//
// A consumer that dies between its commit and its XACK leaves the entry
// pending; whoever claims it (XAUTOCLAIM) gets it again, and the inbox
// skips it as a duplicate.
package redisinbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The entry fields the relay's Redis sink writes (sinks/redissink).
const (
	FieldID  = "id"
	FieldKey = "key"
	FieldSeq = wire.Seq
	// FieldProducer names the outbox the entry comes from: the relay's
	// outbox-producer header (inbox.HeaderProducer), a field like every
	// header. Positions are compared per producer. A sink with a
	// header_prefix writes it under the prefix: set Message's Producer
	// from that field instead.
	FieldProducer = inbox.HeaderProducer
)

// ErrNoID is returned for an entry without an id field (not written by
// the relay).
var ErrNoID = errors.New("outbox: redisinbox: entry has no id field")

// Message returns the inbox message of entry x: id, key, outbox-seq and
// outbox-producer fields (position 0 and producer "" when absent).
func Message(x redis.XMessage) (inbox.Message, error) {
	var m inbox.Message
	m.ID, _ = x.Values[FieldID].(string)
	if m.ID == "" {
		return m, ErrNoID
	}
	m.Key, _ = x.Values[FieldKey].(string)
	m.Producer, _ = x.Values[FieldProducer].(string)
	if s, _ := x.Values[FieldSeq].(string); s != "" {
		seq, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return m, fmt.Errorf("outbox: redisinbox: %s field %q: %w", FieldSeq, s, err)
		}
		m.Seq = seq
	}
	return m, nil
}

// Group names the stream and consumer group an entry was read from.
type Group struct {
	Client redis.Cmdable
	Stream string
	Group  string
}

// Handle runs fn for entry x (read from g) through the inbox in a
// transaction on db and XACKs it after the commit; a duplicate is acked
// without running fn. When it fails (no id, fn fails, x is out of order:
// an *inbox.OutOfOrderError) the entry stays pending for a later claim,
// and the error is returned.
func Handle(ctx context.Context, in *inbox.Inbox, db inbox.Beginner, g Group, x redis.XMessage, fn func(ctx context.Context, tx pgx.Tx, x redis.XMessage) error) (inbox.Outcome, error) {
	m, err := Message(x)
	if err != nil {
		return 0, err
	}
	o, err := in.Run(ctx, db, m, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, x) })
	if err != nil {
		return 0, err
	}
	if err := g.Client.XAck(ctx, g.Stream, g.Group, x.ID).Err(); err != nil {
		return o, fmt.Errorf("outbox: redisinbox: XACK %s (processed; it comes again as a duplicate): %w", x.ID, err)
	}
	return o, nil
}

// HandleBatch is Handle for the entries of one read (XREADGROUP or
// XAUTOCLAIM): one transaction and one inbox statement for all of them,
// then one XACK. When the batch holds an out-of-order entry it is handled
// again one entry at a time, so the entries before that one are applied
// and acknowledged; the first error is returned.
func HandleBatch(ctx context.Context, in *inbox.Inbox, db inbox.Beginner, g Group, xs []redis.XMessage, fn func(ctx context.Context, tx pgx.Tx, x redis.XMessage) error) error {
	if len(xs) == 0 {
		return nil
	}
	ms := make([]inbox.Message, len(xs))
	ids := make([]string, len(xs))
	for i, x := range xs {
		m, err := Message(x)
		if err != nil {
			return fmt.Errorf("%w (entry %s)", err, x.ID)
		}
		ms[i], ids[i] = m, x.ID
	}
	_, err := in.RunBatch(ctx, db, ms, func(ctx context.Context, tx pgx.Tx, i int) error { return fn(ctx, tx, xs[i]) })
	if errors.Is(err, inbox.ErrOutOfOrder) {
		for _, x := range xs {
			if _, err := Handle(ctx, in, db, g, x, fn); err != nil {
				return err
			}
		}
		return nil
	}
	if err != nil {
		return err
	}
	if err := g.Client.XAck(ctx, g.Stream, g.Group, ids...).Err(); err != nil {
		return fmt.Errorf("outbox: redisinbox: XACK %d entries (processed; they come again as duplicates): %w", len(ids), err)
	}
	return nil
}
