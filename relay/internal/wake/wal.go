package wake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
)

// WAL wake-up. The watcher follows the outbox's inserts through logical
// replication: pgoutput, the publication `migrate` creates where wal_level
// = logical, and a TEMPORARY slot, which the server drops when the
// connection ends, so nothing retains WAL while no relay runs (and there
// is no slot for anyone to clean up). The stream is only a wake-up: rows
// are still claimed with SKIP LOCKED, so losing it loses nothing, and the
// watcher polls while it is gone.
//
// A slot decodes every change of the database, and without streaming
// keeps a transaction until its commit: one over logical_decoding_work_mem,
// on any table, was spilled to the server's pg_replslot (600k unrelated
// rows: 70 MB). Where the server can (14+), the watcher asks for large
// transactions to be streamed while they run; pgoutput drops the changes
// of unpublished tables from the segments, and the watcher wakes on the
// Stream Commit. See docs/design.md, "WAL wake-up".
//
// The stream says which rows were committed and, where the publication
// carries the key (migrate publishes (id, key)), their lanes. It carries
// a commit once its WAL record is flushed, a moment before the writer's
// transaction is visible to other sessions, so a claim woken by it may
// look too early and, visiting only the lanes it was woken about, miss
// the row (seen: a message in a hundred 100 ms late at 1,000 msg/s when
// nothing looked again). A watcher alone wakes the reported lanes at
// once and looks only for the reported rows that no claim of its process
// returned within walClaimWait; otherwise it looks for the rows
// themselves at each report (see followStream).

// walStatusEvery is how often the follower confirms what it has read, so
// that the server may recycle the WAL behind it.
const walStatusEvery = 5 * time.Second

// followWAL streams the outbox's inserts and calls committed with what
// the stream said of each transaction that inserted rows, until ctx ends
// or the stream fails. started is called once the stream runs: what
// commits from then on is in it.
func (k *Waker) followWAL(ctx context.Context, committed func(walReport), started func()) error {
	version, err := k.walAllowed(ctx)
	if err != nil {
		return err
	}
	conn, pos, err := k.startReplication(ctx, version)
	if conn != nil {
		defer conn.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		return err
	}
	started()
	st := &walStream{conn: conn, pos: pos, committed: committed, streamed: map[uint32]*walTxn{}, cols: map[uint32]walCols{},
		noKey: func() {
			k.log.Info("the WAL stream carries no key (a publication of an earlier migrate): every reported row is looked for before its lane is woken; `outbox-relay migrate` publishes (id, key)",
				"publication", migrations.Publication(k.s.Name()))
		}}
	return st.run(ctx)
}

// walAllowed checks, before any replication connection, that the server
// lets this relay follow the outbox's inserts, and returns its
// server_version_num. A publication that exists and publishes nothing of
// this outbox (a dropped schema leaves it behind) would start a stream
// that never carries a row: the workers would wait for their safety poll.
func (k *Waker) walAllowed(ctx context.Context) (int, error) {
	st, err := k.w.WALState(ctx, k.cfg.Pool, migrations.Publication(k.s.Name()))
	if err != nil {
		return 0, fmt.Errorf("outbox: WAL: %w", err)
	}
	pubName := ident.Quote(migrations.Publication(k.s.Name()))
	switch {
	case !st.Logical:
		return 0, &walRefusedError{"wal_level is not logical"}
	case !st.Published:
		return 0, &walRefusedError{fmt.Sprintf("publication %s does not exist (outbox-relay migrate creates it where wal_level = logical)", pubName)}
	case !st.Covers:
		return 0, &walRefusedError{fmt.Sprintf("publication %s does not publish the inserts into %s (outbox-relay migrate adds them)", pubName, k.s.Table("messages"))}
	}
	return st.ServerVersion, nil
}

// startReplication opens a replication connection, creates a temporary
// slot on it and starts streaming the publication from the slot's
// consistent point, which it returns. The connection, when not nil, is
// the caller's to close, error or not.
func (k *Waker) startReplication(ctx context.Context, version int) (*pgconn.PgConn, pglogrepl.LSN, error) {
	// The pool's BeforeConnect runs for this connection as for the pool's
	// own: it gives the password of the moment (relay.PoolConfig.Password,
	// or a pool's own hook), which a copy of the pool's configuration,
	// made once, would not have after a rotation; and the session
	// settings, which those below then adjust.
	pc := k.cfg.Pool.Config()
	conf := pc.ConnConfig
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, conf); err != nil {
			return nil, 0, fmt.Errorf("outbox: WAL: connect: %w", err)
		}
	}
	cc := &conf.Config
	cc.RuntimeParams["replication"] = "database"
	cc.RuntimeParams["application_name"] = "outbox-relay-wal"
	delete(cc.RuntimeParams, "idle_in_transaction_session_timeout")
	cc.RuntimeParams["statement_timeout"] = "0"
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: WAL: connect: %w", err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	slot := "outbox_relay_" + hex.EncodeToString(rnd[:])
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return conn, 0, fmt.Errorf("outbox: WAL: create temporary slot: %w", err)
	}
	pos, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return conn, 0, fmt.Errorf("outbox: WAL: %w", err)
	}
	pub := ident.Quote(migrations.Publication(k.s.Name()))
	args := []string{"proto_version '1'", "publication_names '" + escapeLiteral(pub) + "'"}
	if version >= walStreamingVersion {
		args = []string{"proto_version '2'", "streaming 'on'", "publication_names '" + escapeLiteral(pub) + "'"}
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, pos, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		return conn, 0, fmt.Errorf("outbox: WAL: start replication (publication %s): %w", pub, err)
	}
	k.log.Debug("following the WAL", "slot", slot, "publication", pub)
	return conn, pos, nil
}

// walStream is a running replication stream and what it said so far.
type walStream struct {
	conn       *pgconn.PgConn
	pos        pglogrepl.LSN // read up to here (confirmed to the server)
	nextStatus time.Time     // when to confirm pos next
	committed  func(walReport)

	txn walTxn // the transaction being sent whole, at its commit
	// Transactions streamed while in progress (PostgreSQL 14+), by
	// top-level xid: their segments may interleave, and only their
	// Stream Commit says they committed.
	streamed  map[uint32]*walTxn
	inStream  bool
	streamXid uint32
	cols      map[uint32]walCols // where id and key are in each relation's tuples
	noKey     func()             // called once if a relation comes without the key
}

// walCols is where a relation's tuples carry id and key (-1: they do
// not; a publication of migrate before (id, key) carries the id alone).
type walCols struct{ id, key int }

// run reads the stream until ctx ends or it fails, confirming what it
// read every walStatusEvery (or when the server asks).
func (st *walStream) run(ctx context.Context) error {
	st.nextStatus = time.Now().Add(walStatusEvery)
	for {
		if time.Now().After(st.nextStatus) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, st.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: st.pos}); err != nil {
				return fmt.Errorf("outbox: WAL: status update: %w", err)
			}
			st.nextStatus = time.Now().Add(walStatusEvery)
		}
		rctx, cancel := context.WithDeadline(ctx, st.nextStatus)
		msg, err := st.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) && !st.conn.IsClosed() {
				continue
			}
			return fmt.Errorf("outbox: WAL: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("outbox: WAL: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if err := st.copyData(m.Data); err != nil {
				return fmt.Errorf("outbox: WAL: %w", err)
			}
		case *pgproto3.CopyDone:
			return errors.New("outbox: WAL: the server ended the stream")
		}
	}
}

// copyData reads one message of the replication protocol: a keepalive,
// or WAL data.
func (st *walStream) copyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		st.pos = max(st.pos, ka.ServerWALEnd)
		if ka.ReplyRequested {
			st.nextStatus = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		st.pos = max(st.pos, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		if len(x.WALData) > 0 {
			return st.pgoutput(x.WALData)
		}
	}
	return nil
}

// pgoutput reads one message of the output plugin. pgoutput sends a
// small transaction once committed: Begin, Relation, Insert..., Commit.
// A large one, with streaming, comes in segments while it runs (Stream
// Start, its changes, Stream Stop; again and again) and ends with Stream
// Commit or Stream Abort. Only the message type matters, and the ids of a
// few inserts.
func (st *walStream) pgoutput(data []byte) error {
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeRelation:
		if m, err := pglogrepl.ParseV2(data, st.inStream); err == nil {
			if rm, ok := m.(*pglogrepl.RelationMessageV2); ok {
				col := func(name string) int {
					return slices.IndexFunc(rm.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == name })
				}
				c := walCols{id: col("id"), key: col("key")}
				st.cols[rm.RelationID] = c
				if c.key < 0 && st.noKey != nil {
					st.noKey()
					st.noKey = nil
				}
			}
		}
	case pglogrepl.MessageTypeInsert:
		st.inserted(data)
	case pglogrepl.MessageTypeCommit:
		if st.txn.inserted {
			st.committed(st.txn.report())
		}
		st.txn = walTxn{}
	case pglogrepl.MessageTypeStreamStart:
		m, err := pglogrepl.ParseV2(data, false)
		if err != nil {
			return err
		}
		st.inStream, st.streamXid = true, m.(*pglogrepl.StreamStartMessageV2).Xid
	case pglogrepl.MessageTypeStreamStop:
		st.inStream = false
	case pglogrepl.MessageTypeStreamCommit:
		m, err := pglogrepl.ParseV2(data, false)
		if err != nil {
			return err
		}
		xid := m.(*pglogrepl.StreamCommitMessageV2).Xid
		if t := st.streamed[xid]; t != nil && t.inserted {
			st.committed(t.report())
		}
		delete(st.streamed, xid)
	case pglogrepl.MessageTypeStreamAbort:
		m, err := pglogrepl.ParseV2(data, false)
		if err != nil {
			return err
		}
		// A subtransaction's abort leaves the transaction going: what it
		// inserted may be gone, and waking for it costs a look only.
		if a := m.(*pglogrepl.StreamAbortMessageV2); a.Xid == a.SubXid {
			delete(st.streamed, a.Xid)
		}
	}
	return nil
}

// inserted records an insert into the transaction it belongs to (the one
// being streamed, if any).
func (st *walStream) inserted(data []byte) {
	t := &st.txn
	if st.inStream {
		if t = st.streamed[st.streamXid]; t == nil {
			t = &walTxn{}
			st.streamed[st.streamXid] = t
		}
	}
	if !t.inserted {
		t.inserted, t.whole = true, true
	}
	if len(t.ids) == walReportIDs {
		t.whole = false
		return
	}
	id, lane, ok := insertedRow(data, st.inStream, st.cols)
	switch {
	case !ok:
		t.whole = false
	case lane < 0:
		t.whole = false
		t.ids = append(t.ids, id)
	default:
		t.ids = append(t.ids, id)
		t.lanes.Add(lane)
	}
}

// walReportIDs bounds the ids a report of the stream carries: those of a
// transaction's first rows (the rest are found by the look for new ids,
// or by the workers' visits of all their lanes).
const walReportIDs = 256

// walStreamingVersion is the first server_version_num whose pgoutput
// streams large transactions while they run (protocol version 2,
// streaming 'on'). Without it, a transaction over logical_decoding_work_mem
// is spilled to the server's pg_replslot until its commit, whatever
// tables it writes: the decoder cannot tell beforehand which changes the
// publication will drop.
const walStreamingVersion = 140000

// walTxn is what the stream said of one transaction so far.
type walTxn struct {
	inserted bool
	ids      []int64   // of its first inserts (walReportIDs)
	lanes    lanes.Set // of those rows
	// whole: ids has every row the transaction inserted, and lanes the
	// lane of each.
	whole bool
}

// walReport is what the stream said of one committed transaction that
// inserted rows.
type walReport struct {
	ids   []int64
	lanes lanes.Set
	whole bool // ids and lanes name every row it inserted
}

func (t *walTxn) report() walReport { return walReport{ids: t.ids, lanes: t.lanes, whole: t.whole} }

// insertedRow reads the id of an inserted row and its lane (-1 where the
// tuple does not carry the key) (inStream: the message is part of a
// streamed transaction, and carries its xid).
func insertedRow(data []byte, inStream bool, cols map[uint32]walCols) (id int64, lane int, ok bool) {
	m, err := pglogrepl.ParseV2(data, inStream)
	if err != nil {
		return 0, 0, false
	}
	im2, ok := m.(*pglogrepl.InsertMessageV2)
	if !ok || im2.Tuple == nil {
		return 0, 0, false
	}
	im := &im2.InsertMessage
	c, ok := cols[im.RelationID]
	tc := im.Tuple.Columns
	if !ok || c.id < 0 || c.id >= len(tc) || tc[c.id].DataType != pglogrepl.TupleDataTypeText {
		return 0, 0, false
	}
	if id, err = strconv.ParseInt(string(tc[c.id].Data), 10, 64); err != nil {
		return 0, 0, false
	}
	lane = -1
	if c.key >= 0 && c.key < len(tc) {
		switch tc[c.key].DataType {
		case pglogrepl.TupleDataTypeNull:
			lane = store.LaneOf(id, nil)
		case pglogrepl.TupleDataTypeText:
			k := string(tc[c.key].Data)
			lane = store.LaneOf(id, &k)
		}
	}
	return id, lane, true
}

// walRefusedError: the server does not allow this relay to follow the WAL
// (not a break of a running stream).
type walRefusedError struct{ why string }

func (e *walRefusedError) Error() string { return "outbox: WAL: " + e.why }

// walRefused reports whether err says the WAL cannot be followed at all
// (configuration or privileges), rather than that a stream broke: the
// watcher then tries again only rarely.
func walRefused(err error) bool {
	var re *walRefusedError
	if errors.As(err, &re) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "42501", "55000", "42704", "28000", "53300": // privilege, wal_level, no publication, pg_hba, too many walsenders
			return true
		}
	}
	return false
}

// escapeLiteral doubles the single quotes of s, for a string literal.
func escapeLiteral(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(out)
}
