// Package kafkainbox connects a segmentio/kafka-go consumer to the inbox:
// Message takes the inbox message (id, key, position) from a record, and
// Consumer runs each record's handler in a database transaction with the
// inbox and commits the record's offset only after that transaction
// committed.
//
// A consumer that dies between its commit and the offset commit gets the
// records again after the restart (or the rebalance), and the inbox skips
// them as duplicates.
package kafkainbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The record headers the relay's Kafka sink sets (sinks/kafkasink).
const (
	HeaderMessageID = wire.MessageID
	HeaderSeq       = wire.Seq
	// HeaderProducer names the outbox the record comes from
	// (inbox.HeaderProducer): positions are compared per producer.
	HeaderProducer = inbox.HeaderProducer
)

// ErrNoID is returned for a record without the outbox-message-id header
// (not published by the relay).
var ErrNoID = errors.New("outbox: kafkainbox: record has no outbox-message-id header")

// Message returns the inbox message of r: id from the outbox-message-id
// header, key = the record key, position from the outbox-seq header (0
// when absent: then only duplicates are checked), producer from the
// outbox-producer header ("" when absent).
func Message(r kafka.Message) (inbox.Message, error) {
	m := inbox.Message{Key: string(r.Key)}
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderMessageID:
			m.ID = string(h.Value)
		case HeaderSeq:
			seq, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return m, fmt.Errorf("outbox: kafkainbox: %s header %q: %w", HeaderSeq, h.Value, err)
			}
			m.Seq = seq
		case HeaderProducer:
			m.Producer = string(h.Value)
		}
	}
	if m.ID == "" {
		return m, ErrNoID
	}
	return m, nil
}

// Reader is what Consumer needs of a *kafka.Reader (with a GroupID).
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Consumer handles the records of a consumer-group Reader through an
// inbox.
type Consumer struct {
	// Reader is a *kafka.Reader with a GroupID (offsets are committed
	// explicitly, so leave CommitInterval at 0). Required.
	Reader Reader
	// Inbox records the processed messages. Required.
	Inbox *inbox.Inbox
	// DB begins the transactions (a *pgxpool.Pool). Required.
	DB inbox.Beginner
	// Handle applies a record's effects through tx. It does not run for a
	// duplicate. Required.
	Handle func(ctx context.Context, tx pgx.Tx, r kafka.Message) error
	// MaxBatch is how many records already fetched go into one
	// transaction (one inbox statement and one offset commit for all of
	// them). Default 1: a transaction per record.
	MaxBatch int
	// BatchWait is how long Run waits for more records to fill a batch
	// once it has one. Default 1 ms.
	BatchWait time.Duration
}

// Run handles records until ctx ends or a record fails; it returns that
// failure (an *inbox.OutOfOrderError, the handler's error, ...) with the
// record's offset not committed, so a restarted consumer gets the record
// again.
func (c *Consumer) Run(ctx context.Context) error {
	if c.Reader == nil || c.Inbox == nil || c.DB == nil || c.Handle == nil {
		return errors.New("outbox: kafkainbox: Consumer: Reader, Inbox, DB and Handle are required")
	}
	wait := c.BatchWait
	if wait <= 0 {
		wait = time.Millisecond
	}
	for {
		r, err := c.Reader.FetchMessage(ctx)
		if err != nil {
			return err
		}
		batch := []kafka.Message{r}
		for len(batch) < c.MaxBatch {
			fctx, cancel := context.WithTimeout(ctx, wait)
			r, err := c.Reader.FetchMessage(fctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				break
			}
			batch = append(batch, r)
		}
		if err := c.Process(ctx, batch...); err != nil {
			return err
		}
	}
}

// Process handles records in one transaction and commits their offsets
// after it committed. When a batch fails with an out-of-order message it
// is tried again one record at a time, so the records before that one are
// applied and committed.
func (c *Consumer) Process(ctx context.Context, rs ...kafka.Message) error {
	ms := make([]inbox.Message, len(rs))
	for i, r := range rs {
		m, err := Message(r)
		if err != nil {
			return fmt.Errorf("%w (topic %s partition %d offset %d)", err, r.Topic, r.Partition, r.Offset)
		}
		ms[i] = m
	}
	var err error
	if len(rs) == 1 {
		_, err = c.Inbox.Run(ctx, c.DB, ms[0], func(ctx context.Context, tx pgx.Tx) error { return c.Handle(ctx, tx, rs[0]) })
	} else {
		_, err = c.Inbox.RunBatch(ctx, c.DB, ms, func(ctx context.Context, tx pgx.Tx, i int) error { return c.Handle(ctx, tx, rs[i]) })
		if errors.Is(err, inbox.ErrOutOfOrder) {
			for _, r := range rs {
				if err := c.Process(ctx, r); err != nil {
					return err
				}
			}
			return nil
		}
	}
	if err != nil {
		return err
	}
	if err := c.Reader.CommitMessages(ctx, rs...); err != nil {
		return fmt.Errorf("outbox: kafkainbox: commit offsets (the records are processed; they come again as duplicates): %w", err)
	}
	return nil
}
