package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ident"
)

// Wake-up: how relays learn of new rows without the writers paying for it
// (package relay, wake.go). One relay process per schema is the watcher,
// elected by a session-level advisory lock on its LISTEN connection; it
// watches for new rows (by polling NewestID, or following the WAL) and
// wakes the other relays with a NOTIFY from its own session.

// watcherLockKey is the first half of the watcher's advisory lock (the
// second is a hash of the schema name); the migrations' and the archive's
// locks use other constants.
const watcherLockKey = 0x6f757477 // "outw"

// Waker holds the wake-up statements for one schema.
type Waker struct {
	channel, trigger string
	tryLock, newest  stmt
	newRows          stmt
	notify           stmt
	triggerState     stmt
}

// NewWaker renders the wake-up statements for schema s.
func NewWaker(s Schema) *Waker {
	return &Waker{
		channel: ident.Channel(s.name),
		trigger: "ALTER TABLE " + s.Table("messages") + " ENABLE TRIGGER messages_notify",
		// Session level: the lock is the watcher's for as long as its
		// session lives, and goes with it when the session dies.
		tryLock: newStmt(`SELECT pg_try_advisory_lock(@key, hashtext(@schema))`),
		// A backward scan of the primary key: one index probe.
		newest: newStmt(`SELECT coalesce(max(id), 0) FROM ` + s.Table("messages")),
		// The rows committed past the newest one seen, by primary key,
		// and their lanes; bounded, the next look goes on from there.
		newRows: newStmt(`SELECT coalesce(max(n.id), @seen), coalesce(array_agg(DISTINCT n.lane), '{}')
FROM (SELECT m.id, m.lane FROM ` + s.Table("messages") + ` m WHERE m.id > @seen ORDER BY m.id LIMIT 10000) n`),
		notify: newStmt(`SELECT pg_notify(@channel, @payload)`),
		triggerState: newStmt(`SELECT t.tgenabled <> 'D' FROM pg_trigger t
WHERE t.tgrelid = to_regclass(@table) AND t.tgname = 'messages_notify'`),
	}
}

// TryWatch takes the schema's watcher lock for q's session, if no other
// session holds it, and reports whether it did. The lock is held until
// the session ends.
func (w *Waker) TryWatch(ctx context.Context, q Querier, s Schema) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, w.tryLock.sql, w.tryLock.args(pgx.NamedArgs{"key": watcherLockKey, "schema": s.name})...).Scan(&ok)
	return ok, err
}

// NewestID returns the highest id among the committed outbox rows (0 when
// the outbox is empty).
func (w *Waker) NewestID(ctx context.Context, q Querier) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, w.newest.sql).Scan(&id)
	return id, err
}

// NewRows returns the highest id among the committed outbox rows past
// seen (seen when there are none) and the lanes of those rows (of the
// first 10,000 of them).
func (w *Waker) NewRows(ctx context.Context, q Querier, seen int64) (int64, []int16, error) {
	var id int64
	var lanes []int16
	err := q.QueryRow(ctx, w.newRows.sql, w.newRows.args(pgx.NamedArgs{"seen": seen})...).Scan(&id, &lanes)
	return id, lanes, err
}

// Notify sends payload on the schema's channel from q's session ("" means
// new rows: every relay looks for work).
func (w *Waker) Notify(ctx context.Context, q Querier, payload string) error {
	_, err := q.Exec(ctx, w.notify.sql, w.notify.args(pgx.NamedArgs{"channel": w.channel, "payload": payload})...)
	return err
}

// NotifyTrigger reports whether the writers' trigger (messages_notify) is
// enabled; with enable, it first enables it when it is not, which needs
// ownership of the messages table (ErrNotOwner otherwise).
func (w *Waker) NotifyTrigger(ctx context.Context, q Querier, s Schema, enable bool) (bool, error) {
	var on bool
	err := q.QueryRow(ctx, w.triggerState.sql, w.triggerState.args(pgx.NamedArgs{"table": s.Table("messages")})...).Scan(&on)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil || on || !enable {
		return on, err
	}
	if _, err := q.Exec(ctx, w.trigger); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return false, ErrNotOwner
		}
		return false, err
	}
	return true, nil
}

// ErrNotOwner: the statement needs ownership of the table.
var ErrNotOwner = errors.New("outbox: must be the owner of the messages table")
