package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// Floor B: the least a process that learns of new rows from the WAL does
// to deliver a trickle. It reads the outbox's inserts through pgoutput on
// a temporary slot and delivers each message from the stream alone (its
// publication carries whole rows, where the relay's carries the id only:
// the relay reads the rows it is woken for, this reader never reads the
// table). Every floorWALInterval it deletes what it delivered with one
// statement. It keeps no order and no lanes, retries nothing and sends
// nowhere: what is left of the relay's cost over this one's is the
// relay's own. The walsender that decodes for it runs in the database
// under the relay's application_name, so its CPU is counted with the
// reader's sessions, as the relay's walsender is with the relay's.

// floorWALInterval is how often floor B deletes what it delivered.
const floorWALInterval = 10 * time.Millisecond

// floorWALStatusEvery is how often floor B confirms what it deleted, so
// that the slot advances (and when the server asks).
const floorWALStatusEvery = 5 * time.Second

// floorPublication is floor B's publication: the outbox's inserts, every
// column.
const floorPublication = "outbox_floor_b"

// walFloor is floor B's loop: conn deletes, a replication connection of
// its own reads the stream.
func walFloor(ctx context.Context, conn *pgx.Conn, schema string, c *floorCounters) error {
	pub := pgx.Identifier{floorPublication}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pub); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+migrations.Ident(schema)+".messages WITH (publish = 'insert')"); err != nil {
		return fmt.Errorf("floor B: publication: %w", err)
	}
	rc, err := pgconn.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	rc.RuntimeParams["replication"] = "database"
	rc.RuntimeParams["application_name"] = "outbox-relay-wal" // its walsender is followed with the reader's sessions
	repl, err := pgconn.ConnectConfig(ctx, rc)
	if err != nil {
		return fmt.Errorf("floor B: replication connection: %w", err)
	}
	defer repl.Close(context.WithoutCancel(ctx))
	slot, err := pglogrepl.CreateReplicationSlot(ctx, repl, "outbox_floor_b", "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return fmt.Errorf("floor B: temporary slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, repl, slot.SlotName, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + floorPublication + "'"}})
	if err != nil {
		return fmt.Errorf("floor B: start replication: %w", err)
	}
	// From here on every commit is in the stream: the parent may write.
	stop, err := c.serve(os.Getenv("BENCH_FLOOR_ADMIN"))
	if err != nil {
		return err
	}
	defer stop()
	r := &walReader{repl: repl, conn: conn, c: c, confirmed: start, idCol: map[uint32]int{}, deleted: map[int64]bool{},
		del: "DELETE FROM " + migrations.Ident(schema) + ".messages WHERE id = ANY($1) RETURNING id"}
	if err := r.run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("floor B: %w", err)
	}
	return nil
}

// walReader is floor B's stream and what it delivered.
type walReader struct {
	repl *pgconn.PgConn
	conn *pgx.Conn
	del  string
	c    *floorCounters

	idCol     map[uint32]int // the position of id in each relation's tuples
	inTxn     bool
	txn       []int64        // ids of the transaction being read
	pending   []int64        // delivered, not yet deleted
	deleted   map[int64]bool // what the last DELETE returned
	pendingTo pglogrepl.LSN  // the end of the last transaction in pending
	due       time.Time      // when pending is deleted
	confirmed pglogrepl.LSN  // deleted (or nothing to delete) up to here
	statusAt  time.Time      // when to confirm next
}

// run reads the stream until ctx ends or it fails. It wakes for the
// stream, for a deletion due, and for a status update; nothing else.
func (r *walReader) run(ctx context.Context) error {
	r.statusAt = time.Now().Add(floorWALStatusEvery)
	for {
		now := time.Now()
		if len(r.pending) > 0 && !now.Before(r.due) {
			if err := r.deleteDelivered(ctx); err != nil {
				return err
			}
		}
		if !now.Before(r.statusAt) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, r.repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: r.confirmed}); err != nil {
				return err
			}
			r.statusAt = now.Add(floorWALStatusEvery)
		}
		wake := r.statusAt
		if len(r.pending) > 0 && r.due.Before(wake) {
			wake = r.due
		}
		rctx, cancel := context.WithDeadline(ctx, wake)
		msg, err := r.repl.ReceiveMessage(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil && pgconn.Timeout(err) && !r.repl.IsClosed():
			continue
		case err != nil:
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return errors.New("the server ended the stream")
		case *pgproto3.CopyData:
			if err := r.copyData(m.Data); err != nil {
				return err
			}
		}
	}
}

// deleteDelivered deletes the delivered rows with one statement and
// counts them as published, as floor A counts the rows its DELETE
// returns. The stream carries a commit once its WAL record is flushed, a
// moment before the transaction is visible to other sessions: a row the
// DELETE did not see yet stays delivered, for the next one.
func (r *walReader) deleteDelivered(ctx context.Context) error {
	rows, err := r.conn.Query(ctx, r.del, r.pending)
	if err != nil {
		return err
	}
	clear(r.deleted)
	var id int64
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
		r.deleted[id] = true
		return nil
	})
	if err != nil {
		return err
	}
	if n := len(r.deleted); n > 0 {
		r.c.published.Add(int64(n))
		r.c.batches.Add(1)
	}
	r.pending = slices.DeleteFunc(r.pending, func(id int64) bool { return r.deleted[id] })
	if len(r.pending) > 0 {
		r.due = nextTick(time.Now())
		return nil
	}
	r.confirmed = max(r.confirmed, r.pendingTo)
	return nil
}

// nextTick is floor B's next time to delete after t: the next multiple
// of floorWALInterval.
func nextTick(t time.Time) time.Time { return t.Truncate(floorWALInterval).Add(floorWALInterval) }

// copyData reads one message of the replication protocol.
func (r *walReader) copyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		if len(r.pending) == 0 && !r.inTxn {
			r.confirmed = max(r.confirmed, ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			r.statusAt = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		if len(x.WALData) > 0 {
			return r.pgoutput(x.WALData)
		}
	}
	return nil
}

// pgoutput reads one message of the output plugin (protocol 1: a
// transaction comes whole once committed, Begin, Relation, Insert...,
// Commit). A committed transaction's rows are delivered: their ids wait
// for the next deletion, at the next multiple of floorWALInterval.
func (r *walReader) pgoutput(data []byte) error {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		r.idCol[m.RelationID] = slices.IndexFunc(m.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == "id" })
	case *pglogrepl.BeginMessage:
		r.inTxn, r.txn = true, r.txn[:0]
	case *pglogrepl.InsertMessage:
		c, ok := r.idCol[m.RelationID]
		if !ok || c < 0 || m.Tuple == nil || c >= len(m.Tuple.Columns) {
			return fmt.Errorf("an insert into relation %d without its id", m.RelationID)
		}
		id, err := m.Tuple.Columns[c].Int64()
		if err != nil {
			return err
		}
		r.txn = append(r.txn, id)
	case *pglogrepl.CommitMessage:
		r.inTxn = false
		if len(r.txn) == 0 {
			break
		}
		if len(r.pending) == 0 {
			r.due = nextTick(time.Now())
		}
		r.pending = append(r.pending, r.txn...)
		r.pendingTo = m.TransactionEndLSN
	}
	return nil
}
