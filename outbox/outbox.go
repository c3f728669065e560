// Package outbox is the writer side of outbox-relay: applications call
// Write inside the transaction that changes their business rows, and the
// relay publishes the messages after that transaction commits. A rolled
// back transaction writes no message.
//
// The compiler keeps the write inside a transaction: Write and Insert take
// a pgx.Tx (which *pgxpool.Tx satisfies and a pool or a connection does
// not), WriteSQL and InsertSQL a *sql.Tx.
//
// Outside the standard library this package imports only pgx and
// google/uuid (TestImportsOnlyPgxAndUUID keeps it so); it knows nothing
// about brokers, the migration files or tracing. Trace context reaches a
// message's headers through WriterConfig.Headers (package outboxotel has
// the OpenTelemetry implementation).
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ident"
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

	// ID is the stable message id consumers deduplicate on. Empty: the
	// writer generates one (a UUIDv7). Must be a UUID when set.
	ID string
	// DedupKey makes the write idempotent: while a message with the same
	// DedupKey is pending (written and not yet delivered or
	// dead-lettered), writing another is a no-op and Insert reports the
	// pending message's id. Empty: no deduplication.
	DedupKey string
	// DeliverAt delays delivery until this time. A delayed message holds
	// back the later messages of its key until it is delivered.
	DeliverAt time.Time
	// DeliverAfter delays delivery by this long after the writing
	// transaction started, on the database clock. Ignored when DeliverAt
	// is set.
	DeliverAfter time.Duration
	// Priority lets a message overtake the backlog of other keys: the
	// relay claims messages with a higher priority first (0, the default,
	// is the plain path; at most MaxPriority). It never overtakes an
	// earlier message of its own key, which goes out before it.
	Priority int
}

// MaxPriority is the highest Message.Priority (the column is a smallint).
const MaxPriority = 32767

// Written reports the outcome of one message of an Insert.
type Written struct {
	// MessageID is the id of the message written, or of the pending
	// message that had the same DedupKey.
	MessageID string
	// Duplicate is true when nothing was written because of DedupKey.
	Duplicate bool
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
	// Deprecated: no longer returned. Write and Insert take a pgx.Tx,
	// WriteSQL and InsertSQL a *sql.Tx, so the compiler refuses what
	// this error used to report at run time.
	ErrUnsupportedTx   = errors.New("outbox: unsupported transaction type")
	ErrInvalidDelay    = errors.New("outbox: invalid delay")
	ErrInvalidID       = errors.New("outbox: invalid message id")
	ErrInvalidPriority = errors.New("outbox: invalid priority")
	// ErrDuplicateID: a message's ID is that of another message in the
	// same call or of a pending message (one not yet delivered).
	ErrDuplicateID = errors.New("outbox: duplicate message id")
)

// ErrSchemaMissing: the outbox's tables are not in the schema the call
// names (the database was never migrated, or the schema name is wrong).
// Write, the relay and the operator commands all wrap it, with the
// database's own error, so that errors.Is finds it. It is
// migrations.ErrSchemaMissing too.
var ErrSchemaMissing = ident.ErrSchemaMissing

// SchemaMissing returns err wrapped with ErrSchemaMissing and what to do
// when err is the database saying that the schema or one of its tables
// does not exist (SQLSTATE 3F000 or 42P01), and err itself otherwise. It
// reads the SQLSTATE through the SQLState method that both pgx and
// lib/pq errors have.
func SchemaMissing(err error, schema string) error { return ident.SchemaMissing(err, schema) }

// MaxTopicLen is the longest topic accepted, in bytes (Kafka's limit is
// 249). The table enforces it too (migration 8).
const MaxTopicLen = 249

// MaxKeyLen is the longest key, and the longest dedup key, accepted, in
// bytes. The table enforces it too: a longer key could not be stored in
// the index entries the relay needs to retry the message.
const MaxKeyLen = 1024

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
	case len(m.Key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidKey, len(m.Key), MaxKeyLen)
	case len(m.DedupKey) > MaxKeyLen:
		return fmt.Errorf("%w: dedup key is %d bytes, at most %d", ErrInvalidKey, len(m.DedupKey), MaxKeyLen)
	case m.Payload == nil:
		return ErrNilPayload
	case maxPayload > 0 && len(m.Payload) > maxPayload:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(m.Payload), maxPayload)
	case !utf8.ValidString(m.DedupKey) || strings.ContainsRune(m.DedupKey, 0):
		return fmt.Errorf("%w: dedup key must be valid UTF-8 without NUL", ErrInvalidKey)
	case m.DeliverAfter < 0:
		return fmt.Errorf("%w: DeliverAfter is negative", ErrInvalidDelay)
	case m.Priority < 0 || m.Priority > MaxPriority:
		return fmt.Errorf("%w: %d is outside 0..%d", ErrInvalidPriority, m.Priority, MaxPriority)
	}
	if m.ID != "" {
		if _, err := uuid.Parse(m.ID); err != nil {
			return fmt.Errorf("%w: ID %q is not a UUID", ErrInvalidID, m.ID)
		}
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
	table      string
	maxPayload int
	headers    HeaderInjector
	// Two variants of each insert: the plain one, and the one that skips
	// duplicates of pending dedup keys (ON CONFLICT costs a little, so it
	// is used only for batches that carry dedup keys).
	insertPgx, insertPgxDedup string
	insertSQL, insertSQLDedup string
}

// HeaderInjector adds headers taken from the writing context (a trace
// context, say) to each message. InjectHeaders must not modify headers:
// it returns headers itself when it has nothing to add, otherwise a copy
// with its additions. outboxotel.TraceContext is the OpenTelemetry one.
type HeaderInjector interface {
	InjectHeaders(ctx context.Context, headers map[string]string) map[string]string
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Schema holds the outbox table. Default "outbox".
	Schema string
	// MaxPayloadBytes rejects larger payloads at write time. Default 16 MiB;
	// negative disables the check.
	MaxPayloadBytes int
	// Headers is called for every message written, with the context
	// given to Write, and its result is what is stored. Default nil:
	// headers are stored as given (the package-level Write and Insert
	// use this default). Set it to outboxotel.TraceContext{} to store
	// the W3C trace context of a traced operation, which the relay's
	// spans continue.
	Headers HeaderInjector
}

// NewWriter returns a Writer for cfg.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Schema == "" {
		cfg.Schema = ident.DefaultSchema
	}
	if err := ident.ValidateSchema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	table := ident.Quote(cfg.Schema) + ".messages"
	// available_at stays NULL unless delivery really is delayed, so that
	// only delayed rows enter the relay's "waiting" index.
	const availableAt = "CASE WHEN at > now() THEN at WHEN after_ms > 0 THEN now() + after_ms * interval '1 millisecond' END"
	const conflict = " ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING message_id::text"
	// One statement, one round trip, whatever the number of messages.
	pgxInsert := "INSERT INTO " + table + " (message_id, topic, key, payload, headers, dedup_key, available_at, priority)" +
		" SELECT id, t, k, p, h::jsonb, d, " + availableAt + ", pr" +
		" FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::timestamptz[], $8::bigint[], $9::int2[])" +
		" AS u(id, t, k, p, h, d, at, after_ms, pr)"
	// database/sql drivers differ in how they pass arrays, so the portable
	// form sends the batch as one JSON document.
	sqlInsert := "INSERT INTO " + table + " (message_id, topic, key, payload, headers, dedup_key, available_at, priority)" +
		" SELECT id, topic, key, decode(payload, 'base64'), headers, d, " + availableAt + ", coalesce(pr, 0)" +
		" FROM jsonb_to_recordset($1::jsonb)" +
		" AS m(id uuid, topic text, key text, payload text, headers jsonb, d text, at timestamptz, after_ms bigint, pr smallint)"
	return &Writer{
		schema:         cfg.Schema,
		table:          table,
		maxPayload:     cfg.MaxPayloadBytes,
		headers:        cfg.Headers,
		insertPgx:      pgxInsert,
		insertPgxDedup: pgxInsert + conflict,
		insertSQL:      sqlInsert,
		insertSQLDedup: sqlInsert + conflict,
	}, nil
}

var defaultWriter, _ = NewWriter(WriterConfig{})

// Write inserts msgs into the default "outbox" schema through tx, a pgx
// transaction, in one round trip. Call it inside the transaction that
// changes your business rows: the messages become visible to the relay
// only when that transaction commits. A *pgxpool.Pool or *pgx.Conn does
// not compile here: begin a transaction (pool.Begin) and pass that.
func Write(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return defaultWriter.Write(ctx, tx, msgs...)
}

// WriteSQL is Write for database/sql: tx is a *sql.Tx (a *sql.DB does not
// compile here: begin a transaction with db.BeginTx and pass that).
func WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	return defaultWriter.WriteSQL(ctx, tx, msgs...)
}

// Insert is Write that also reports, for each message, its id and whether
// it was skipped as a duplicate of a pending message with the same
// DedupKey. Batches without dedup keys take one round trip; batches with
// duplicates take a second one to look up the pending ids.
func Insert(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]Written, error) {
	return defaultWriter.Insert(ctx, tx, msgs...)
}

// InsertSQL is Insert for database/sql; see WriteSQL.
func InsertSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]Written, error) {
	return defaultWriter.InsertSQL(ctx, tx, msgs...)
}

// Write inserts msgs through tx; see the package-level Write.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	_, err := w.Insert(ctx, tx, msgs...)
	return err
}

// WriteSQL inserts msgs through tx; see the package-level WriteSQL.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	_, err := w.InsertSQL(ctx, tx, msgs...)
	return err
}

// Insert writes msgs through tx; see the package-level Insert.
func (w *Writer) Insert(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]Written, error) {
	return w.insert(ctx, pgxQuerier{tx}, msgs)
}

// InsertSQL writes msgs through tx; see the package-level InsertSQL.
func (w *Writer) InsertSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]Written, error) {
	return w.insert(ctx, sqlQuerier{tx}, msgs)
}

func (w *Writer) insert(ctx context.Context, q querier, msgs []Message) ([]Written, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	b := batch{msgs: msgs, ids: make([]string, len(msgs))}
	var given map[uuid.UUID]int // caller-set ids, to refuse repeats
	for i := range msgs {
		m := &msgs[i]
		if err := m.validate(w.maxPayload); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		b.ids[i] = m.ID
		if m.ID != "" {
			id := uuid.MustParse(m.ID) // validated
			if j, ok := given[id]; ok {
				return nil, fmt.Errorf("message %d: %w: %s is also the id of message %d", i, ErrDuplicateID, m.ID, j)
			}
			if given == nil {
				given = map[uuid.UUID]int{}
			}
			given[id] = i
		}
		if b.ids[i] == "" {
			id, err := uuid.NewV7()
			if err != nil {
				return nil, fmt.Errorf("outbox: generate message id: %w", err)
			}
			b.ids[i] = id.String()
		}
		if m.DedupKey != "" {
			b.dedup = true
		}
	}
	rows, err := w.encode(ctx, &b)
	if err != nil {
		return nil, err
	}
	inserted, err := q.insert(ctx, w, rows, b.dedup)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.ConstraintName == "messages_message_id_idx" {
			return nil, fmt.Errorf("outbox: write %d messages: %w: a pending message already has this id (%s)", len(msgs), ErrDuplicateID, pe.Detail)
		}
		return nil, SchemaMissing(fmt.Errorf("outbox: write %d messages: %w", len(msgs), err), w.schema)
	}
	out := make([]Written, len(msgs))
	var dupKeys []string
	for i, id := range b.ids {
		out[i].MessageID = id
		if b.dedup && !inserted[id] {
			out[i].Duplicate = true
			dupKeys = append(dupKeys, msgs[i].DedupKey)
		}
	}
	if len(dupKeys) == 0 {
		return out, nil
	}
	pending, err := q.pendingIDs(ctx, w, dupKeys)
	if err != nil {
		return nil, fmt.Errorf("outbox: look up duplicates: %w", err)
	}
	for i := range out {
		if out[i].Duplicate {
			if id, ok := pending[msgs[i].DedupKey]; ok {
				out[i].MessageID = id
			}
		}
	}
	return out, nil
}

type batch struct {
	msgs  []Message
	ids   []string
	dedup bool
}

// row is one message encoded as both insert statements take it: one
// encoder, two transports (pgx sends the rows as column arrays,
// database/sql as one JSON document).
type row struct {
	ID      string          `json:"id"`
	Topic   string          `json:"topic"`
	Key     *string         `json:"key"`     // NULL: no key
	Payload []byte          `json:"payload"` // base64 in JSON
	Headers json.RawMessage `json:"headers"` // a JSON object
	Dedup   *string         `json:"d,omitempty"`
	At      *time.Time      `json:"at,omitempty"`
	AfterMS int64           `json:"after_ms,omitempty"`
	Prio    int16           `json:"pr,omitempty"`
}

// encode builds the rows of b, after the Headers hook.
func (w *Writer) encode(ctx context.Context, b *batch) ([]row, error) {
	rows := make([]row, len(b.msgs))
	for i := range b.msgs {
		m := &b.msgs[i]
		h := m.Headers
		if w.headers != nil {
			h = w.headers.InjectHeaders(ctx, h)
		}
		hj, err := encodeHeaders(h)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		r := row{ID: b.ids[i], Topic: m.Topic, Payload: m.Payload, Headers: hj,
			AfterMS: m.DeliverAfter.Milliseconds(), Prio: int16(m.Priority)} // validated range
		if m.Key != "" {
			r.Key = &m.Key
		}
		if m.DedupKey != "" {
			r.Dedup = &m.DedupKey
		}
		if !m.DeliverAt.IsZero() {
			r.At = &m.DeliverAt
		}
		rows[i] = r
	}
	return rows, nil
}

// querier runs the writer's two statements through one kind of
// transaction.
type querier interface {
	// insert returns the ids actually inserted (only computed when
	// dedup: the batch carries dedup keys).
	insert(ctx context.Context, w *Writer, rows []row, dedup bool) (map[string]bool, error)
	pendingIDs(ctx context.Context, w *Writer, keys []string) (map[string]string, error)
}

type pgxQuerier struct{ tx pgx.Tx }

func (p pgxQuerier) insert(ctx context.Context, w *Writer, rows []row, dedup bool) (map[string]bool, error) {
	n := len(rows)
	ids := make([]string, n)
	topics := make([]string, n)
	keys := make([]*string, n)
	payloads := make([][]byte, n)
	headers := make([]string, n)
	dedupKeys := make([]*string, n)
	at := make([]*time.Time, n)
	after := make([]int64, n)
	prio := make([]int16, n)
	for i, r := range rows {
		ids[i], topics[i], keys[i], payloads[i], headers[i] = r.ID, r.Topic, r.Key, r.Payload, string(r.Headers)
		dedupKeys[i], at[i], after[i], prio[i] = r.Dedup, r.At, r.AfterMS, r.Prio
	}
	args := []any{ids, topics, keys, payloads, headers, dedupKeys, at, after, prio}
	if !dedup {
		_, err := p.tx.Exec(ctx, w.insertPgx, args...)
		return nil, err
	}
	res, err := p.tx.Query(ctx, w.insertPgxDedup, args...)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(res, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return toSet(inserted), nil
}

func (p pgxQuerier) pendingIDs(ctx context.Context, w *Writer, keys []string) (map[string]string, error) {
	rows, err := p.tx.Query(ctx, "SELECT dedup_key, message_id::text FROM "+w.table+" WHERE dedup_key = ANY($1)", keys)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var k, id string
	_, err = pgx.ForEachRow(rows, []any{&k, &id}, func() error { out[k] = id; return nil })
	return out, err
}

type sqlQuerier struct{ tx *sql.Tx }

func (s sqlQuerier) insert(ctx context.Context, w *Writer, rows []row, dedup bool) (map[string]bool, error) {
	doc, err := json.Marshal(rows)
	if err != nil {
		return nil, fmt.Errorf("encode messages: %w", err)
	}
	if !dedup {
		_, err := s.tx.ExecContext(ctx, w.insertSQL, string(doc))
		return nil, err
	}
	res, err := s.tx.QueryContext(ctx, w.insertSQLDedup, string(doc))
	if err != nil {
		return nil, err
	}
	defer res.Close()
	set := map[string]bool{}
	for res.Next() {
		var id string
		if err := res.Scan(&id); err != nil {
			return nil, err
		}
		set[id] = true
	}
	return set, res.Err()
}

func (s sqlQuerier) pendingIDs(ctx context.Context, w *Writer, keys []string) (map[string]string, error) {
	doc, _ := json.Marshal(keys)
	rows, err := s.tx.QueryContext(ctx, "SELECT dedup_key, message_id::text FROM "+w.table+
		" WHERE dedup_key IN (SELECT jsonb_array_elements_text($1::jsonb))", string(doc))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			return nil, err
		}
		out[k] = id
	}
	return out, rows.Err()
}

func toSet(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func encodeHeaders(h map[string]string) (json.RawMessage, error) {
	if len(h) == 0 {
		return json.RawMessage("{}"), nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidHeader, err)
	}
	return b, nil
}
