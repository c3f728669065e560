// Package outbox is the writer side of outbox-relay: applications call
// Write inside the transaction that changes their business rows, and the
// relay publishes the messages after that transaction commits. A rolled
// back transaction writes no message.
//
// This package depends only on pgx; it knows nothing about brokers.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// Message is one event to publish.
type Message struct {
	// Topic is the logical destination: a Kafka topic, an AMQP routing key,
	// an HTTP route. Required.
	Topic string
	// Key orders and partitions messages: messages with the same key are
	// delivered in the order they were written. Empty means no key (NULL),
	// and no ordering.
	Key string
	// Payload is delivered byte for byte. Required (may be empty, not nil).
	Payload []byte
	// Headers are delivered as message headers.
	Headers map[string]string
}

// Validation errors. Write wraps them with the index of the offending
// message; test with errors.Is.
var (
	ErrEmptyTopic      = errors.New("outbox: topic must not be empty")
	ErrInvalidTopic    = errors.New("outbox: invalid topic")
	ErrNilPayload      = errors.New("outbox: payload must not be nil (use []byte{} for an empty payload)")
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	ErrInvalidHeader   = errors.New("outbox: invalid header")
	ErrInvalidKey      = errors.New("outbox: invalid key")
	ErrUnsupportedTx   = errors.New("outbox: unsupported transaction type")
)

// MaxTopicLen is the longest topic accepted (Kafka's limit is 249).
const MaxTopicLen = 249

// DefaultMaxPayloadBytes is Writer's default payload limit (Postgres allows
// up to 1 GiB in a bytea, but no broker does).
const DefaultMaxPayloadBytes = 16 << 20

// Validate checks m and returns a descriptive error wrapping one of the
// Err* sentinels.
func (m Message) Validate() error { return m.validate(DefaultMaxPayloadBytes) }

func (m Message) validate(maxPayload int) error {
	switch {
	case m.Topic == "":
		return ErrEmptyTopic
	case len(m.Topic) > MaxTopicLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidTopic, len(m.Topic), MaxTopicLen)
	case !utf8.ValidString(m.Topic):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidTopic)
	case strings.IndexFunc(m.Topic, isControl) >= 0:
		return fmt.Errorf("%w: %q contains a control character", ErrInvalidTopic, m.Topic)
	case !utf8.ValidString(m.Key) || strings.ContainsRune(m.Key, 0):
		return fmt.Errorf("%w: must be valid UTF-8 without NUL", ErrInvalidKey)
	case m.Payload == nil:
		return ErrNilPayload
	case maxPayload > 0 && len(m.Payload) > maxPayload:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(m.Payload), maxPayload)
	}
	for k, v := range m.Headers {
		switch {
		case k == "":
			return fmt.Errorf("%w: empty name", ErrInvalidHeader)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return fmt.Errorf("%w: %q: not valid UTF-8", ErrInvalidHeader, k)
		case strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return fmt.Errorf("%w: %q: contains NUL", ErrInvalidHeader, k)
		}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// Writer writes messages into one outbox schema.
type Writer struct {
	schema     string
	maxPayload int
	insertPgx  string
	insertSQL  string
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Schema holds the outbox table. Default "outbox".
	Schema string
	// MaxPayloadBytes rejects larger payloads at write time. Default 16 MiB;
	// negative disables the check.
	MaxPayloadBytes int
}

// NewWriter returns a Writer for cfg.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Schema == "" {
		cfg.Schema = migrations.DefaultSchema
	}
	if err := migrations.ValidateSchema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	table := migrations.Ident(cfg.Schema) + ".messages"
	return &Writer{
		schema:     cfg.Schema,
		maxPayload: cfg.MaxPayloadBytes,
		// One statement, one round trip, whatever the number of messages.
		insertPgx: "INSERT INTO " + table + " (topic, key, payload, headers)" +
			" SELECT t, k, p, h::jsonb FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) AS u(t, k, p, h)",
		// database/sql drivers differ in how they pass arrays, so the
		// portable form sends the batch as one JSON document.
		insertSQL: "INSERT INTO " + table + " (topic, key, payload, headers)" +
			" SELECT m.topic, m.key, decode(m.payload, 'base64'), coalesce(m.headers, '{}')" +
			" FROM jsonb_to_recordset($1::jsonb) AS m(topic text, key text, payload text, headers jsonb)",
	}, nil
}

var defaultWriter, _ = NewWriter(WriterConfig{})

// PgxExecer is satisfied by pgx.Tx, *pgxpool.Tx, *pgx.Conn and anything
// else with pgx's Exec.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is satisfied by *sql.Tx, *sql.Conn and *sql.DB.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Write inserts msgs into the default "outbox" schema through tx, in one
// round trip. tx is a pgx transaction (pgx.Tx, *pgxpool.Tx or anything with
// pgx's Exec) or a database/sql one (*sql.Tx or anything with ExecContext).
// Call it inside the transaction that changes your business rows: the
// messages become visible to the relay only when that transaction commits.
func Write(ctx context.Context, tx any, msgs ...Message) error {
	return defaultWriter.Write(ctx, tx, msgs...)
}

// Write inserts msgs through tx; see the package-level Write.
func (w *Writer) Write(ctx context.Context, tx any, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if err := m.validate(w.maxPayload); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	switch tx := tx.(type) {
	case PgxExecer:
		return w.writePgx(ctx, tx, msgs)
	case SQLExecer:
		return w.writeSQL(ctx, tx, msgs)
	default:
		return fmt.Errorf("%w: %T (want a pgx.Tx or *sql.Tx)", ErrUnsupportedTx, tx)
	}
}

func (w *Writer) writePgx(ctx context.Context, tx PgxExecer, msgs []Message) error {
	topics := make([]string, len(msgs))
	keys := make([]*string, len(msgs))
	payloads := make([][]byte, len(msgs))
	headers := make([]string, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		topics[i] = m.Topic
		if m.Key != "" {
			keys[i] = &m.Key
		}
		payloads[i] = m.Payload
		h, err := encodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		headers[i] = h
	}
	if _, err := tx.Exec(ctx, w.insertPgx, topics, keys, payloads, headers); err != nil {
		return fmt.Errorf("outbox: write %d messages: %w", len(msgs), err)
	}
	return nil
}

type jsonMessage struct {
	Topic   string            `json:"topic"`
	Key     *string           `json:"key"`
	Payload []byte            `json:"payload"` // base64 by encoding/json
	Headers map[string]string `json:"headers"`
}

func (w *Writer) writeSQL(ctx context.Context, tx SQLExecer, msgs []Message) error {
	batch := make([]jsonMessage, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		batch[i] = jsonMessage{Topic: m.Topic, Payload: m.Payload, Headers: m.Headers}
		if m.Key != "" {
			batch[i].Key = &m.Key
		}
	}
	doc, err := json.Marshal(batch)
	if err != nil {
		return fmt.Errorf("outbox: encode messages: %w", err)
	}
	if _, err := tx.ExecContext(ctx, w.insertSQL, string(doc)); err != nil {
		return fmt.Errorf("outbox: write %d messages: %w", len(msgs), err)
	}
	return nil
}

func encodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidHeader, err)
	}
	return string(b), nil
}
