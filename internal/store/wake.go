package store

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

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

// listenerLockKey is the first half of the advisory lock every LISTEN
// session of a relay process (or of a ListenConfig) holds shared, so that
// the watcher can tell whether anyone else listens (see Others).
const listenerLockKey = 0x6f75746c // "outl"

// ListenerPayload is the payload a LISTEN session sends once it listens:
// a watcher that thought it was alone sends its wake-ups again.
const ListenerPayload = "listener"

// Waker holds the wake-up statements for one schema.
type Waker struct {
	channel, trigger string
	schema           string // the schema's name
	table            string // the outbox, quoted
	tryLock, newest  stmt
	walState         stmt
	newRows, due     stmt
	notify           stmt
	triggerState     stmt
	join, others     stmt
	// prepared is the session PrepareLooks set up (nil: none): its looks
	// go out as one statement each.
	prepared atomic.Pointer[pgx.Conn]
}

// NewWaker renders the wake-up statements for schema s.
func NewWaker(s Schema) *Waker {
	return &Waker{
		table:   s.Table("messages"),
		schema:  s.name,
		channel: ident.Channel(s.name),
		trigger: "ALTER TABLE " + s.Table("messages") + " ENABLE TRIGGER messages_notify",
		// Session level: the lock is the watcher's for as long as its
		// session lives, and goes with it when the session dies.
		tryLock: newStmt(`SELECT pg_try_advisory_lock(@key, hashtext(@schema))`),
		// A backward scan of the primary key: one index probe.
		newest: newStmt(`SELECT coalesce(max(id), 0) FROM ` + s.Table("messages")),
		// The rows committed past the newest one seen, by primary key,
		// and their lanes; bounded, the next look goes on from there.
		// Also the rows of @gaps: ids below the newest seen that were
		// missing at an earlier look, which a transaction that took its
		// id before another one's but committed after it fills later;
		// not read at all when there are none (see NewRows).
		newRows: newStmt(`WITH n AS MATERIALIZED (
    SELECT m.id, m.lane FROM ` + s.Table("messages") + ` m WHERE m.id > @seen ORDER BY m.id LIMIT ` + strconv.Itoa(NewRowsLimit) + `
), g AS MATERIALIZED (
    SELECT m.id, m.lane FROM ` + s.Table("messages") + ` m WHERE m.id = ANY(@gaps::bigint[]) AND cardinality(@gaps::bigint[]) > 0
)
SELECT coalesce((SELECT max(id) FROM n), @seen),
       coalesce((SELECT array_agg(id ORDER BY id) FROM n WHERE id > (SELECT max(id) FROM n) - @span), '{}'),
       coalesce((SELECT array_agg(DISTINCT lane) FROM (SELECT lane FROM n UNION ALL SELECT lane FROM g) l), '{}'),
       coalesce((SELECT array_agg(id) FROM g), '{}')`),
		// The lanes of the rows (retries, delayed messages, in the outbox
		// and among the fan-out copies) that came due after @since, and
		// when the next one will: ranges and probes of the partial
		// indexes on available_at. A parked dead letter ('infinity') is
		// never due. @since is the previous look's clock in microseconds
		// since the epoch, as the database gave it (the relay sends no
		// time of its own clock).
		due: newStmt(`WITH t AS MATERIALIZED (SELECT timestamptz 'epoch' + @since * interval '1 microsecond' AS since)
SELECT now(), (extract(epoch FROM now()) * 1000000)::bigint,
       coalesce((SELECT array_agg(DISTINCT d.lane) FROM (
           (SELECT m.lane FROM ` + s.Table("messages") + ` m, t WHERE m.available_at > t.since AND m.available_at <= now() LIMIT 10000)
           UNION ALL
           (SELECT c.lane FROM ` + s.Table("deliveries") + ` c, t WHERE c.available_at > t.since AND c.available_at <= now() LIMIT 10000)) d), '{}'),
       least((SELECT min(m.available_at) FROM ` + s.Table("messages") + ` m WHERE m.available_at > now() AND m.available_at < 'infinity'),
             (SELECT min(c.available_at) FROM ` + s.Table("deliveries") + ` c WHERE c.available_at > now() AND c.available_at < 'infinity')),
       (SELECT q.last_value FROM pg_sequences q
        WHERE format('%I.%I', q.schemaname, q.sequencename) = pg_get_serial_sequence(@table, 'id'))`),
		notify: newStmt(`SELECT pg_notify(@channel, @payload)`),
		// Shared and session level, like the watcher's lock: it goes
		// with the session. Never waits (nobody takes it exclusively).
		join: newStmt(`SELECT pg_try_advisory_lock_shared(@key, hashtext(@schema)), pg_notify(@channel, '` + ListenerPayload + `')`),
		// Another session holds the listeners' lock (another process's
		// LISTEN session, or a ListenConfig of this one's), or a relay of
		// another process is registered (a release before the lock
		// existed listens without it). pg_locks is readable by any role.
		others: newStmt(`SELECT EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
             AND l.classid = @key::oid AND l.objid = hashtext(@schema)::oid
             AND l.pid <> pg_backend_pid())
       OR EXISTS (SELECT 1 FROM ` + s.Table("relays") + ` r WHERE r.hostname <> @hostname OR r.pid <> @pid)`),
		triggerState: newStmt(`SELECT t.tgenabled <> 'D' FROM pg_trigger t
WHERE t.tgrelid = to_regclass(@table) AND t.tgname = 'messages_notify'`),
		// What following the WAL needs: the catalog, not the stream (pgoutput
		// only complains of a missing publication at the first change it
		// decodes).
		walState: newStmt(`SELECT current_setting('wal_level') = 'logical', EXISTS (SELECT 1 FROM pg_publication WHERE pubname = @publication),
       EXISTS (SELECT 1 FROM pg_publication p JOIN pg_publication_tables t USING (pubname)
               WHERE p.pubname = @publication AND p.pubinsert AND t.schemaname = @schema AND t.tablename = 'messages'),
       current_setting('server_version_num')::int`),
	}
}

// WALState is what the server says about following the outbox's inserts
// through logical replication.
type WALState struct {
	// Logical: wal_level is logical.
	Logical bool
	// Published: the publication exists; Covers: it publishes the
	// inserts into the schema's outbox (a publication left behind by a
	// dropped schema publishes nothing of a new one).
	Published, Covers bool
	// ServerVersion is server_version_num.
	ServerVersion int
}

// WALState reads what following the WAL through publication needs of
// the server.
func (w *Waker) WALState(ctx context.Context, q Querier, publication string) (WALState, error) {
	var st WALState
	err := q.QueryRow(ctx, w.walState.sql, w.walState.args(pgx.NamedArgs{"publication": publication, "schema": w.schema})...).
		Scan(&st.Logical, &st.Published, &st.Covers, &st.ServerVersion)
	return st, err
}

// TryWatch takes the schema's watcher lock for q's session, if no other
// session holds it, and reports whether it did. The lock is held until
// the session ends.
func (w *Waker) TryWatch(ctx context.Context, q Querier, s Schema) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, w.tryLock.sql, w.tryLock.args(pgx.NamedArgs{"key": watcherLockKey, "schema": s.name})...).Scan(&ok)
	return ok, err
}

// Pooled reports whether c's session goes through a transaction-pooling
// proxy (PgBouncer, pgcat, Odyssey, RDS Proxy): the backend that answers
// is not the one whose process id the connection was given at start-up
// (a proxy makes one up). Such a session keeps no state of its own:
// LISTEN, advisory locks, prepared statements and settings stay on a
// backend that other clients then use. Run in pgx's exec mode (an
// unnamed statement in one round trip), so that the check itself
// prepares nothing there; not in the simple protocol, which pgx refuses
// on a session whose client_encoding is not UTF8 (a SQL_ASCII database,
// which the relay then refuses with a clear error).
func Pooled(ctx context.Context, c *pgx.Conn) (bool, error) {
	var pid int64
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeExec).Scan(&pid); err != nil {
		return false, err
	}
	return uint32(pid) != c.PgConn().PID(), nil
}

// NewestID returns the highest id among the committed outbox rows (0 when
// the outbox is empty).
func (w *Waker) NewestID(ctx context.Context, c *pgx.Conn) (int64, error) {
	var id int64
	err := w.look(ctx, c, w.newest.sql, false, nil, &id)
	return id, err
}

// noSeqScanSession is NoSeqScan for a whole session.
const noSeqScanSession = "SELECT set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false), set_config('jit', 'off', false)"

// PrepareLooks sets c's session up for the watcher's looks (NoSeqScan's
// settings for the session, not each transaction), so that each look is
// one statement instead of BEGIN, the settings, the look and COMMIT: at
// 100 messages a second the looks were most of the relay's database
// time. Only for a session of its own that is never given back to a pool,
// and never through a transaction-pooling proxy (the settings would stay
// on a backend that others then use). The session must run read committed
// (the relay's pool sets default_transaction_isolation).
func (w *Waker) PrepareLooks(ctx context.Context, c *pgx.Conn) error {
	if _, err := c.Exec(ctx, noSeqScanSession); err != nil {
		return err
	}
	w.prepared.Store(c)
	return nil
}

// look runs one of the watcher's looks on c, planned without sequential
// scans (see NoSeqScan): alone on a session PrepareLooks set up, else in
// a transaction of its own, in one round trip: BEGIN, the setting, the
// look and COMMIT. (Not a session setting: behind
// a transaction-pooling proxy it would stay on a server connection that
// others then use.) fresh: planned for args each time, not by the plan
// Postgres keeps for the prepared statement (pgx's exec mode; a batch
// runs in the session's own mode, which is exec through such a proxy,
// the only sessions that take the batch). An error leaves c in a failed
// transaction: the watcher gives its session up on any error.
func (w *Waker) look(ctx context.Context, c *pgx.Conn, sql string, fresh bool, args []any, dest ...any) error {
	if w.prepared.Load() == c {
		if fresh {
			args = append([]any{pgx.QueryExecModeExec}, args...)
		}
		return c.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	b := &pgx.Batch{}
	b.Queue(Begin)
	b.Queue(NoSeqScan)
	b.Queue(sql, args...).QueryRow(func(r pgx.Row) error { return r.Scan(dest...) })
	b.Queue("COMMIT")
	return c.SendBatch(ctx, b).Close()
}

// NewRows is what a look for new rows found: the highest id among the
// committed outbox rows past seen (seen when there are none), the ids of
// those within span of the highest (the caller looks for gaps only
// there), the lanes of the rows past seen (of the first 10,000) and of
// the rows found among the gaps, and the ids of the gaps that were found.
// NewRowsLimit is the most new rows one look reads: a look whose newest
// row is less than this far past seen read every row committed past it.
const NewRowsLimit = 10000

type NewRows struct {
	Newest     int64
	IDs        []int64
	Lanes      []int16
	GapsFilled []int64
}

// NewRows looks for rows committed past seen and for the rows of gaps.
func (w *Waker) NewRows(ctx context.Context, c *pgx.Conn, seen int64, gaps []int64, span int64) (NewRows, error) {
	var n NewRows
	if gaps == nil {
		gaps = []int64{}
	}
	// With gaps, planned for them and the outbox as it is now. The plan
	// Postgres keeps for the prepared look is made once, mostly on an
	// empty outbox, and on one it reads the gaps' rows through the whole
	// (lane, id) index (an index-only scan costs least there) and, once
	// a backlog came, the heap tuple of every one of its rows: 540 ms a
	// look on a 200k backlog (TestLooksPlannedOnAnEmptyOutbox). Without
	// gaps that part of the plan does not run.
	err := w.look(ctx, c, w.newRows.sql, len(gaps) > 0, w.newRows.args(pgx.NamedArgs{"seen": seen, "gaps": gaps, "span": span}), &n.Newest, &n.IDs, &n.Lanes, &n.GapsFilled)
	return n, err
}

// Due is what a look for rows that came due found.
type Due struct {
	// Now is the database's clock at the look.
	Now time.Time
	// Since is Now as the next look's since.
	Since int64
	// Lanes are the lanes of the rows that came due after since.
	Lanes []int16
	// Next is when the next waiting row comes due; zero when none waits.
	Next time.Time
	// LastID is the last id the outbox's identity handed out, when the
	// relay's role may read it (SELECT on the sequence; else, and before
	// the first id after a reset, 0). The polling watcher's looks go on
	// from the newest id they saw; an identity that was reset (TRUNCATE …
	// RESTART IDENTITY, a restore) hands out ids below it.
	LastID int64
}

// Due looks for the rows (of the outbox and of the fan-out copies) that
// came due after since (an earlier look's Since; 0 at first), for the
// next one to come due, and for the identity's last id (pg_sequences: no
// row of the outbox is read).
func (w *Waker) Due(ctx context.Context, c *pgx.Conn, since int64) (Due, error) {
	var d Due
	var next pgtype.Timestamptz
	var last pgtype.Int8
	err := w.look(ctx, c, w.due.sql, false, w.due.args(pgx.NamedArgs{"since": since, "table": w.table}), &d.Now, &d.Since, &d.Lanes, &next, &last)
	d.LastID = last.Int64
	if next.Valid && next.InfinityModifier == pgtype.Finite {
		d.Next = next.Time
	}
	return d, err
}

// Join takes q's session into the schema's listeners (a shared advisory
// lock held until the session ends) and tells the watcher, which may have
// stopped notifying while it thought no other process listened. Run it
// after LISTEN.
func (w *Waker) Join(ctx context.Context, q Querier, s Schema) error {
	_, err := q.Exec(ctx, w.join.sql, w.join.args(pgx.NamedArgs{"key": listenerLockKey, "schema": s.name, "channel": w.channel})...)
	return err
}

// Others reports whether any session but c's listens on the schema's
// channel as a relay does, or a relay process other than the one at
// hostname and pid is registered: only then do the watcher's wake-ups
// have anyone to wake. Planned as it comes (not under NoSeqScan: the
// relays table is read whole, it is small).
func (w *Waker) Others(ctx context.Context, c *pgx.Conn, s Schema, hostname string, pid int) (bool, error) {
	var others bool
	err := c.QueryRow(ctx, w.others.sql, w.others.args(pgx.NamedArgs{"key": listenerLockKey, "schema": s.name, "hostname": hostname, "pid": pid})...).Scan(&others)
	return others, err
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
