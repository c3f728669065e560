// Package inbox is the consumer half of outbox-relay: it makes the effects
// of a message happen once per message id, whatever the redeliveries,
// crashes and restarts, and in write order per key.
//
// Inside the consumer's own database transaction, Handle records the
// message (its id, key and position) and runs the handler's effects, so
// that both commit or neither does. A message whose id was recorded before
// is a duplicate, whichever producer sent it: the handler does not run.
// Per producer and key, the inbox keeps a high-water mark, the highest
// position processed; a message that arrives below its mark without
// having been processed (a message the consumer would otherwise apply out
// of order) is never applied silently: by default Handle returns an
// *OutOfOrderError and the transaction must roll back (Config.OutOfOrder
// chooses to apply it anyway, reported). Positions are compared only
// within one producer (Message.Producer): each outbox numbers its own
// rows, so a consumer of several outboxes keeps a mark for each.
//
// The compiler keeps Handle inside a transaction: it takes a pgx.Tx (which
// *pgxpool.Tx satisfies and a pool or a connection does not); HandleSQL
// takes a *sql.Tx. Run and RunSQL begin the transaction, call Handle and
// commit; a broker adapter acknowledges the message only after they
// return nil (packages kafkainbox, amqpinbox, natsinbox, redisinbox,
// httpinbox, ceinbox).
//
// The tables live in a schema of the consumer's choosing: Migrate creates
// them under an advisory lock, Script prints them as plain SQL. Prune
// removes processed ids older than a retention window, and optionally the
// marks of keys idle for longer than another, in small batches.
//
// Cost: one statement per message (one per batch with HandleBatch), which
// records the id and checks and advances the key's mark together.
//
// Outside the standard library this package imports only pgx
// (TestImportsOnlyPgx keeps it so): it knows nothing about the relay, the
// sinks or the brokers.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// DefaultSchema is the schema of the inbox tables when none is configured.
const DefaultSchema = "inbox"

// HeaderProducer is the header in which the relay names the outbox a
// message comes from (its --producer): the adapters read it into
// Message.Producer.
const HeaderProducer = wire.Producer

// Message is what the inbox needs to know of a delivered message. The
// adapters take it from each broker's message.
type Message struct {
	// ID is the stable message id, a UUID (the relay's message_id: Kafka
	// header outbox-message-id, AMQP message-id, Nats-Msg-Id, the Redis
	// entry's id field, webhook-id, the CloudEvents id).
	ID string
	// Key is the message's ordering key; "" when it has none (then no
	// order is checked, only duplicates).
	Key string
	// Seq is the message's position (the outbox row's id, header
	// outbox-seq): a key's messages carry growing positions in write
	// order. 0 means unknown: no order is checked, only duplicates.
	Seq int64
	// Producer names the outbox the message comes from (header
	// outbox-producer, HeaderProducer): positions are compared only
	// between messages of one producer, since each outbox numbers its own
	// rows. "" means the message names none: Config.Producer stands for
	// it, and when that is "" too, such messages share one mark per key,
	// as all messages did before producers were named.
	Producer string
}

// Outcome says what Handle did with a message.
type Outcome int

const (
	// Processed: the message was new; it is recorded and the handler ran.
	Processed Outcome = iota + 1
	// Duplicate: the message's id was processed before (a redelivery,
	// early or late); the handler did not run.
	Duplicate
	// AppliedOutOfOrder: the message arrived below its key's mark without
	// having been processed, and Config.OutOfOrder is ApplyOutOfOrder: it
	// is recorded and the handler ran.
	AppliedOutOfOrder
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case AppliedOutOfOrder:
		return "applied out of order"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// OutOfOrderPolicy says what Handle does with a message that arrives below
// its key's high-water mark without having been processed.
type OutOfOrderPolicy int

const (
	// RejectOutOfOrder (the default) returns an *OutOfOrderError: the
	// handler does not run, the caller rolls back and does not acknowledge
	// the message, so the broker redelivers it and the consumer sees the
	// error until somebody decides (a redelivery stays out of order: fix
	// it by hand, or switch the key to ApplyOutOfOrder).
	RejectOutOfOrder OutOfOrderPolicy = iota
	// ApplyOutOfOrder records the message and runs the handler anyway,
	// reporting it through Hooks.OutOfOrder: for effects that commute
	// (sums, sets), where the order of two messages does not matter but
	// losing one does.
	ApplyOutOfOrder
)

// ErrOutOfOrder is matched by every *OutOfOrderError (errors.Is).
var ErrOutOfOrder = errors.New("outbox: inbox: message below its key's high-water mark was never processed")

// OutOfOrderError reports a message that arrived below its key's
// high-water mark without having been processed: a message that, applied
// now, would land after later messages of its key. It happens when the
// key's writers do not serialize (two transactions of one key committing
// out of id order), after a dead letter of the key was replayed while the
// key moved on, after the outbox's id sequence was reset (positions go
// backwards), and for a redelivery that comes after the retention window
// pruned its id.
type OutOfOrderError struct {
	ID       string
	Key      string
	Producer string // "" when neither the message nor Config names one
	Seq      int64  // the message's position
	Mark     int64  // the key's high-water mark, for Producer
}

func (e *OutOfOrderError) Error() string {
	key := fmt.Sprintf("key %q", e.Key)
	if e.Producer != "" {
		key += fmt.Sprintf(" of producer %q", e.Producer)
	}
	return fmt.Sprintf("outbox: inbox: message %s of %s at position %d is below the key's high-water mark %d and was never processed", e.ID, key, e.Seq, e.Mark)
}

// Is makes errors.Is(err, ErrOutOfOrder) true.
func (e *OutOfOrderError) Is(target error) bool { return target == ErrOutOfOrder }

// Hooks observe what the inbox decides, for metrics and logs. Every
// method is called inside the consumer's transaction, before the handler
// runs (for a rolled-back transaction too), so it must be quick and must
// not fail. A nil Hooks observes nothing.
type Hooks interface {
	// Duplicate: m's id was processed before; the handler did not run.
	Duplicate(m Message)
	// OutOfOrder: m arrived below its key's mark without having been
	// processed. Called whatever the policy.
	OutOfOrder(m Message, mark int64)
	// Gap: with Config.Contiguous, m's position skipped past mark+1: the
	// messages in between have not arrived (yet).
	Gap(m Message, mark int64)
}

// Config configures an Inbox. The zero value is usable.
type Config struct {
	// Schema holds the inbox tables (inbox_messages, inbox_keys,
	// inbox_migrations). Default "inbox". It may be the outbox's schema,
	// or the consumer's own.
	Schema string
	// OutOfOrder is the policy for a message below its key's mark that was
	// never processed. Default RejectOutOfOrder.
	OutOfOrder OutOfOrderPolicy
	// Contiguous says the positions of a key have no holes (1, 2, 3, ...:
	// a sequence the writer keeps per key and the consumer puts in
	// Message.Seq), so a position past mark+1 is a gap, reported through
	// Hooks.Gap. Default false: the relay's positions are outbox ids,
	// shared by all keys, so a key's positions skip by design and a
	// missing message shows only when it arrives late (OutOfOrderError).
	Contiguous bool
	// Hooks observe duplicates, out-of-order messages and gaps. Default
	// nil.
	Hooks Hooks
	// Producer names the producer of the messages that name none
	// (Message.Producer ""): for a consumer that knows where its messages
	// come from when they do not say it (a relay that sends no
	// outbox-producer header, each producer on its own queue or endpoint),
	// with an Inbox per producer over the same schema. Default "": such
	// messages share one mark per key.
	Producer string
}

// Inbox records processed messages in one schema.
type Inbox struct {
	cfg    Config
	schema string
	one    string // the statement for one message
	batch  string // the statement for a batch (pgx arrays)
	prune  string
	// pruneKeys removes a batch of idle keys' rows.
	pruneKeys string
}

// New returns an Inbox for cfg.
func New(cfg Config) (*Inbox, error) {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if err := validSchema(cfg.Schema); err != nil {
		return nil, err
	}
	switch cfg.OutOfOrder {
	case RejectOutOfOrder, ApplyOutOfOrder:
	default:
		return nil, fmt.Errorf("outbox: inbox: OutOfOrder: unknown policy %d", cfg.OutOfOrder)
	}
	msgs, keys := quote(cfg.Schema)+".inbox_messages", quote(cfg.Schema)+".inbox_keys"
	// One statement records the id (a conflict means a duplicate: nothing
	// else is written) and, for a new keyed message, advances the mark of
	// its producer and key, returning the mark it found. ON CONFLICT DO
	// UPDATE locks the mark's row, so consumers racing on one key take
	// turns, and reads the latest committed mark, not the statement's
	// snapshot. It stamps the row's touched_at for PruneConfig.KeyWindow:
	// the row is rewritten anyway, and touched_at has no index, so the
	// update stays HOT.
	one := `WITH ins AS (
    INSERT INTO ` + msgs + ` (message_id, key, seq) VALUES ($1::uuid, $2::text, $3::bigint)
    ON CONFLICT DO NOTHING RETURNING 1
), k AS (
    INSERT INTO ` + keys + ` AS k (producer, key, mark) SELECT $4::text, $2::text, $3::bigint FROM ins WHERE $2::text <> '' AND $3::bigint > 0
    ON CONFLICT (producer, key) DO UPDATE SET prev = k.mark, mark = greatest(k.mark, excluded.mark), touched_at = now()
    RETURNING prev
)
SELECT EXISTS (SELECT FROM ins), coalesce((SELECT prev FROM k), 0)`
	// The batch form: ids inserted in id order and marks locked in
	// primary-key order, so that two consumers' overlapping batches cannot
	// deadlock; each mark advances once, to the batch's highest new
	// position. The producer is not recorded with the id (duplicates are
	// found by id alone), so the new ids are joined back to the batch for
	// it; the batch's ids are distinct (AcceptBatch drops repeats).
	batch := `WITH m AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[]) AS m(id, key, seq, producer)
), ins AS (
    INSERT INTO ` + msgs + ` (message_id, key, seq) SELECT id, key, seq FROM m ORDER BY id
    ON CONFLICT DO NOTHING RETURNING message_id, key, seq
), k AS (
    INSERT INTO ` + keys + ` AS k (producer, key, mark)
    SELECT m.producer, ins.key, max(ins.seq) FROM ins JOIN m ON m.id = ins.message_id
    WHERE ins.key <> '' AND ins.seq > 0 GROUP BY m.producer, ins.key ORDER BY m.producer, ins.key
    ON CONFLICT (producer, key) DO UPDATE SET prev = k.mark, mark = greatest(k.mark, excluded.mark), touched_at = now()
    RETURNING producer, key, prev
)
SELECT (SELECT coalesce(array_agg(message_id::text), '{}') FROM ins),
    (SELECT coalesce(array_agg(producer), '{}') FROM k), (SELECT coalesce(array_agg(key), '{}') FROM k), (SELECT coalesce(array_agg(prev), '{}') FROM k)`
	prune := `WITH gone AS (
    SELECT message_id FROM ` + msgs + ` WHERE processed_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM ` + msgs + ` m USING gone WHERE m.message_id = gone.message_id`
	// Marks idle for longer than the window, walked in primary-key order
	// (producer, key) from a cursor (touched_at has no index, see above),
	// a batch at a time; a mark a consumer holds (it is advancing it) or
	// another Prune holds is skipped, and a mark touched since the
	// statement's snapshot fails the recheck of FOR UPDATE.
	pruneKeys := `WITH gone AS (
    SELECT producer, key FROM ` + keys + ` WHERE (producer, key) > ($1::text, $2::text) AND touched_at < now() - $3::bigint * interval '1 millisecond'
    ORDER BY producer, key LIMIT $4
    FOR UPDATE SKIP LOCKED
), del AS (
    DELETE FROM ` + keys + ` k USING gone WHERE (k.producer, k.key) = (gone.producer, gone.key) RETURNING k.producer, k.key
), last AS (
    SELECT producer, key FROM del ORDER BY producer DESC, key DESC LIMIT 1
)
SELECT (SELECT count(*) FROM del), coalesce((SELECT producer FROM last), ''), coalesce((SELECT key FROM last), '')`
	return &Inbox{cfg: cfg, schema: cfg.Schema, one: one, batch: batch, prune: prune, pruneKeys: pruneKeys}, nil
}

// Schema returns the schema of the inbox tables.
func (in *Inbox) Schema() string { return in.schema }

// Accept records m as processed in tx, or reports why it must not be
// applied, without running anything: Handle is Accept followed by the
// handler. It returns Processed or AppliedOutOfOrder when the caller must
// apply m's effects in tx, Duplicate when it must not, and an
// *OutOfOrderError (with RejectOutOfOrder) when tx must roll back.
func (in *Inbox) Accept(ctx context.Context, tx pgx.Tx, m Message) (Outcome, error) {
	if err := m.check(); err != nil {
		return 0, err
	}
	m = in.named(m)
	var fresh bool
	var mark int64
	if err := tx.QueryRow(ctx, in.one, m.ID, m.Key, m.Seq, m.Producer).Scan(&fresh, &mark); err != nil {
		return 0, fmt.Errorf("outbox: inbox: record %s: %w", m.ID, err)
	}
	return in.decide(m, fresh, mark)
}

// AcceptSQL is Accept for database/sql.
func (in *Inbox) AcceptSQL(ctx context.Context, tx *sql.Tx, m Message) (Outcome, error) {
	if err := m.check(); err != nil {
		return 0, err
	}
	m = in.named(m)
	var fresh bool
	var mark int64
	if err := tx.QueryRowContext(ctx, in.one, m.ID, m.Key, m.Seq, m.Producer).Scan(&fresh, &mark); err != nil {
		return 0, fmt.Errorf("outbox: inbox: record %s: %w", m.ID, err)
	}
	return in.decide(m, fresh, mark)
}

// named returns m with its producer: its own, else Config.Producer.
func (in *Inbox) named(m Message) Message {
	if m.Producer == "" {
		m.Producer = in.cfg.Producer
	}
	return m
}

// decide turns what the statement found into an outcome. mark is the
// mark of m's producer and key before the statement (0: none, or the
// message is unkeyed).
func (in *Inbox) decide(m Message, fresh bool, mark int64) (Outcome, error) {
	if !fresh {
		if in.cfg.Hooks != nil {
			in.cfg.Hooks.Duplicate(m)
		}
		return Duplicate, nil
	}
	if m.Key == "" || m.Seq <= 0 || mark == 0 {
		return Processed, nil
	}
	if m.Seq <= mark {
		if in.cfg.Hooks != nil {
			in.cfg.Hooks.OutOfOrder(m, mark)
		}
		if in.cfg.OutOfOrder == ApplyOutOfOrder {
			return AppliedOutOfOrder, nil
		}
		return 0, &OutOfOrderError{ID: m.ID, Key: m.Key, Producer: m.Producer, Seq: m.Seq, Mark: mark}
	}
	if in.cfg.Contiguous && m.Seq > mark+1 && in.cfg.Hooks != nil {
		in.cfg.Hooks.Gap(m, mark)
	}
	return Processed, nil
}

// Handle records m as processed in tx and runs fn in the same transaction,
// unless m is a duplicate (then fn does not run). Commit tx after Handle
// returns nil, and acknowledge the broker only after the commit; roll it
// back when Handle returns an error (an *OutOfOrderError, or fn's error:
// the record goes with the effects). fn receives tx: every effect that
// must happen once goes through it.
func (in *Inbox) Handle(ctx context.Context, tx pgx.Tx, m Message, fn func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	o, err := in.Accept(ctx, tx, m)
	if err != nil || o == Duplicate {
		return o, err
	}
	if err := fn(ctx, tx); err != nil {
		return o, err
	}
	return o, nil
}

// HandleSQL is Handle for database/sql: tx is a *sql.Tx (a *sql.DB does
// not compile here).
func (in *Inbox) HandleSQL(ctx context.Context, tx *sql.Tx, m Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	o, err := in.AcceptSQL(ctx, tx, m)
	if err != nil || o == Duplicate {
		return o, err
	}
	if err := fn(ctx, tx); err != nil {
		return o, err
	}
	return o, nil
}

// AcceptBatch is Accept for a batch of messages, in one statement: it
// returns one outcome per message, in order. A message whose id appears
// earlier in the batch is a Duplicate. When a message is out of order
// (below its mark, or below an earlier message of its producer and key in
// the batch) and the policy is RejectOutOfOrder, it returns the
// *OutOfOrderError of the first such message and tx must roll back:
// retry the batch's messages one at a time to apply the others.
func (in *Inbox) AcceptBatch(ctx context.Context, tx pgx.Tx, ms []Message) ([]Outcome, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	out := make([]Outcome, len(ms))
	n := len(ms)
	ids, keys, seqs, producers := make([]string, 0, n), make([]string, 0, n), make([]int64, 0, n), make([]string, 0, n)
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		if err := m.check(); err != nil {
			return nil, err
		}
		id := strings.ToLower(m.ID)
		if seen[id] {
			out[i] = Duplicate
			continue
		}
		seen[id] = true
		m = in.named(m)
		ids, keys, seqs, producers = append(ids, m.ID), append(keys, m.Key), append(seqs, m.Seq), append(producers, m.Producer)
	}
	var inserted, markProducers, markKeys []string
	var marks []int64
	if err := tx.QueryRow(ctx, in.batch, ids, keys, seqs, producers).Scan(&inserted, &markProducers, &markKeys, &marks); err != nil {
		return nil, fmt.Errorf("outbox: inbox: record a batch of %d: %w", len(ms), err)
	}
	fresh := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}
	last := make(map[markOf]int64, len(markKeys))
	for i, k := range markKeys {
		last[markOf{markProducers[i], k}] = marks[i]
	}
	var first error
	for i, m := range ms {
		m = in.named(m)
		if out[i] == Duplicate {
			if in.cfg.Hooks != nil {
				in.cfg.Hooks.Duplicate(m)
			}
			continue
		}
		at := markOf{m.Producer, m.Key}
		o, err := in.decide(m, fresh[strings.ToLower(m.ID)], last[at])
		if err != nil && first == nil {
			first = err
		}
		out[i] = o
		if o != Duplicate && m.Key != "" && m.Seq > last[at] {
			last[at] = m.Seq
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// markOf names one mark: a producer's key.
type markOf struct{ producer, key string }

// HandleBatch records ms in tx with one statement (AcceptBatch) and runs
// fn for each message to apply, in order, in the same transaction. See
// AcceptBatch for its errors; on any error tx must roll back.
func (in *Inbox) HandleBatch(ctx context.Context, tx pgx.Tx, ms []Message, fn func(ctx context.Context, tx pgx.Tx, i int) error) ([]Outcome, error) {
	out, err := in.AcceptBatch(ctx, tx, ms)
	if err != nil {
		return nil, err
	}
	for i, o := range out {
		if o == Duplicate {
			continue
		}
		if err := fn(ctx, tx, i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Run begins a transaction on db, calls Handle and commits. It returns nil
// only after the commit: acknowledge the broker then, never before. When
// Handle fails the transaction rolls back and the error is returned.
func (in *Inbox) Run(ctx context.Context, db Beginner, m Message, fn func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	o, err := in.Handle(ctx, tx, m, fn)
	if err != nil {
		return o, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("outbox: inbox: commit %s: %w", m.ID, err)
	}
	return o, nil
}

// RunBatch is Run for a batch (HandleBatch in one transaction). When the
// batch fails with an *OutOfOrderError under RejectOutOfOrder, nothing of
// it is applied; the caller may retry its messages one at a time with Run.
func (in *Inbox) RunBatch(ctx context.Context, db Beginner, ms []Message, fn func(ctx context.Context, tx pgx.Tx, i int) error) ([]Outcome, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	out, err := in.HandleBatch(ctx, tx, ms, fn)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: inbox: commit a batch of %d: %w", len(ms), err)
	}
	return out, nil
}

// RunSQL is Run for database/sql.
func (in *Inbox) RunSQL(ctx context.Context, db *sql.DB, m Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: inbox: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	o, err := in.HandleSQL(ctx, tx, m, fn)
	if err != nil {
		return o, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: inbox: commit %s: %w", m.ID, err)
	}
	return o, nil
}

// PruneConfig bounds one Prune call.
type PruneConfig struct {
	// Window is how long a processed id is kept; older ones are removed.
	// Required (no default: it must outlast the longest time a broker may
	// redeliver a message, which only the operator knows).
	Window time.Duration
	// KeyWindow is how long a key's mark is kept after the key's last new
	// message; the marks of keys idle for longer are removed. Default 0:
	// marks are kept forever (one row per producer and key ever seen).
	// A key's mark is its producer's (Message.Producer): each producer's
	// mark of a key is kept or removed on its own. Otherwise it must
	// be at least Window, so that a key's mark outlives its ids. Once a
	// key's mark is removed the key starts over: its next message is
	// processed whatever its position, so a message of the key that was
	// never processed and arrives later (below the old mark) is applied,
	// not reported as out of order, and a redelivery whose id was pruned
	// too is applied again.
	KeyWindow time.Duration
	// BatchSize is how many ids, or keys, one statement removes, each
	// batch in its own short transaction, so that pruning never holds many
	// row locks or one long transaction. Default 1000.
	BatchSize int
	// MaxBatches bounds the batches of one call, for the ids and for the
	// keys each. Default 0: until nothing older than the window is left.
	MaxBatches int
}

// Pruned is what one Prune call removed.
type Pruned struct {
	// Messages is the processed ids removed (older than Window).
	Messages int64
	// Keys is the keys' marks removed (idle for longer than KeyWindow).
	Keys int64
}

// Prune removes processed ids older than cfg.Window and, when
// cfg.KeyWindow is set, the marks of keys idle for longer than it, in
// batches of cfg.BatchSize, and returns how many of each it removed (also
// when it fails part way). Run it periodically (every few minutes) from
// one consumer or a cron job; concurrent calls skip each other's rows.
//
// A redelivery of a pruned id is no longer recognised as a duplicate: a
// keyed message at or below its key's mark is reported as out of order
// (never applied twice silently), an unkeyed one is processed again. A
// redelivery of a message whose key's mark is pruned too is processed
// again, like an unkeyed one (see PruneConfig.KeyWindow).
//
// The marks are walked once per call in producer and key order, along the
// primary key: a batch's statement reads past the marks that are not
// idle, so a call reads the whole key table once.
func (in *Inbox) Prune(ctx context.Context, db Beginner, cfg PruneConfig) (Pruned, error) {
	var done Pruned
	if cfg.Window <= 0 {
		return done, errors.New("outbox: inbox: prune: Window: must be positive")
	}
	if cfg.KeyWindow < 0 || (cfg.KeyWindow > 0 && cfg.KeyWindow < cfg.Window) {
		return done, fmt.Errorf("outbox: inbox: prune: KeyWindow: %s is shorter than Window (%s): a key's mark must outlive its ids", cfg.KeyWindow, cfg.Window)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchSize < 0 {
		return done, errors.New("outbox: inbox: prune: BatchSize: must not be negative")
	}
	for b := 0; cfg.MaxBatches == 0 || b < cfg.MaxBatches; b++ {
		var n int64
		err := in.inTx(ctx, db, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, in.prune, cfg.Window.Milliseconds(), cfg.BatchSize)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return done, fmt.Errorf("outbox: inbox: prune: %w", err)
		}
		done.Messages += n
		if n < int64(cfg.BatchSize) {
			break
		}
	}
	if cfg.KeyWindow == 0 {
		return done, nil
	}
	var after markOf
	for b := 0; cfg.MaxBatches == 0 || b < cfg.MaxBatches; b++ {
		var n int64
		err := in.inTx(ctx, db, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, in.pruneKeys, after.producer, after.key, cfg.KeyWindow.Milliseconds(), cfg.BatchSize).Scan(&n, &after.producer, &after.key)
		})
		if err != nil {
			return done, fmt.Errorf("outbox: inbox: prune keys: %w", err)
		}
		done.Keys += n
		if n < int64(cfg.BatchSize) {
			break
		}
	}
	return done, nil
}

// inTx runs fn in a transaction of its own and commits it.
func (in *Inbox) inTx(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

func (m Message) check() error {
	if m.ID == "" {
		return errors.New("outbox: inbox: message has no id")
	}
	if m.Seq < 0 {
		return fmt.Errorf("outbox: inbox: message %s: negative position %d", m.ID, m.Seq)
	}
	return nil
}

// validSchema accepts any name Postgres does (it is always quoted).
func validSchema(s string) error {
	switch {
	case s == "":
		return errors.New("outbox: inbox: Schema: must not be empty")
	case len(s) > 63:
		return fmt.Errorf("outbox: inbox: Schema: %d bytes is longer than Postgres' 63", len(s))
	case strings.ContainsRune(s, 0):
		return errors.New("outbox: inbox: Schema: must not contain NUL")
	}
	return nil
}

func quote(s string) string { return ident.Quote(s) }
