package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// The relay engine's statements: their rendered text (golden files) and
// what each family does against a real database.

func TestEngineGolden(t *testing.T) {
	t.Parallel()
	s := testSchema(t)
	for _, src := range []Source{Outbox, Copies, Router} {
		e := NewEngine(s, src, "orders", false)
		p := "engine_" + src.String() + "_"
		golden(t, p+"claim", e.claim.named)
		golden(t, p+"delete", e.deleteDelivered.named)
		golden(t, p+"dead_letter", e.deadLetter.named)
		if src == Router {
			// The router claims in id order whatever the priority, and
			// settles by copying: it runs nothing else.
			golden(t, p+"copy", e.copyToRoutes.named)
			continue
		}
		golden(t, p+"claim_priority", e.claimPriority.named)
		golden(t, p+"claim_settle", e.claimSettle.named)
		golden(t, p+"has_priority", e.hasPriority.named)
		golden(t, p+"archive", e.archiveDelivered.named)
		golden(t, p+"retry", e.scheduleRetry.named)
		golden(t, p+"defer", e.deferRows.named)
		golden(t, p+"relock", e.relock.named)
	}
	golden(t, "engine_copies_left", NewEngine(s, Copies, "orders", false).copiesLeft.named)
	golden(t, "engine_outbox_dead_letter_hold", NewEngine(s, Outbox, "orders", true).deadLetter.named)
	golden(t, "engine_copies_dead_letter_hold", NewEngine(s, Copies, "orders", true).deadLetter.named)

	l := NewLeases(s, "relay-1", "orders")
	for name, sql := range map[string]stmt{
		"ensure_lanes": l.ensureLanes, "heartbeat": l.heartbeat, "clamp_heartbeats": l.clampHeartbeats,
		"reap": l.reap, "renew": l.renew, "count_relays": l.countRelays, "worked_lanes": l.workedLanes,
		"acquire": l.acquire, "release": l.release, "release_all": l.releaseAll, "unregister": l.unregister,
		"notify_members": l.notifyMembers,
		"owned":          l.owned, "other_configs": l.otherConfigs,
	} {
		golden(t, "lease_"+name, sql.named)
	}
	golden(t, "archive_create_partition", NewPartitions(s).createSQL(time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)))
}

func TestPartitionDay(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	got, ok := PartitionDay(PartitionName(day.Add(5 * time.Hour)))
	if !ok || !got.Equal(day) {
		t.Fatalf("PartitionDay(PartitionName(%s)) = %s, %v", day, got, ok)
	}
	for _, n := range []string{"archive", "archive_pnope", "other_p20260102"} {
		if _, ok := PartitionDay(n); ok {
			t.Errorf("%s taken for a partition", n)
		}
	}
}

// engineEnv is a migrated schema whose lanes of route "" all belong to
// relay "me".
type engineEnv struct {
	t    *testing.T
	pool *pgxpool.Pool
	s    Schema
}

// migrated returns a pool and a fresh migrated schema.
func migrated(t *testing.T) (*pgxpool.Pool, Schema) {
	t.Helper()
	pool, name := pgtest.Schema(t)
	s, err := NewSchema(name)
	if err != nil {
		t.Fatal(err)
	}
	return pool, s
}

func setupEngine(t *testing.T) *engineEnv {
	t.Helper()
	pool, s := migrated(t)
	e := &engineEnv{t: t, pool: pool, s: s}
	ctx := context.Background()
	if got, err := NewLeases(s, "me", "").Acquire(ctx, pool, time.Hour, NumLanes); err != nil || len(got) != NumLanes {
		t.Fatalf("acquire: %d lanes, %v", len(got), err)
	}
	return e
}

func (e *engineEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

// claim runs one claim (and settle, when it queues anything) in a
// transaction and commits it.
// claim is what one claim returned.
type claim struct {
	Rows     []ClaimedRow
	Priority bool
}

func (e *engineEnv) claim(en *Engine, p ClaimParams, settle func(b *pgx.Batch, c claim)) claim {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if p.Relay == "" {
		p.Relay, p.Workers, p.Limit, p.MaxBytes = "me", 1, 100, 1<<20
	}
	var c claim
	b := &pgx.Batch{}
	en.QueueClaim(b, p, &c.Priority, func(r ClaimedRow) error { c.Rows = append(c.Rows, r); return nil })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		e.t.Fatal(err)
	}
	if settle != nil {
		b := &pgx.Batch{}
		settle(b, c)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func ids(rows []ClaimedRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

func (e *engineEnv) count(sql string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestClaimOrderHoldAndByteCut(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	// Keyless messages 1..6 fall in lanes 1..6.
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (id, topic, payload) SELECT g, 'orders', convert_to(repeat('x', 100), 'UTF8') FROM generate_series(1, 6) g`)
	en := NewEngine(e.s, Outbox, "", false)

	c := e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 3, Limit: 100, MaxBytes: 1 << 20}, nil)
	if got, want := ids(c.Rows), []int64{3, 4, 5, 6, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want %v (lanes from the rotation on)", got, want)
	}
	if c.Priority {
		t.Fatal("priority probe found priorities in an outbox without any")
	}
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 3, Limit: 100, MaxBytes: 250}, nil)
	if got, want := ids(c.Rows), []int64{3, 4}; !slices.Equal(got, want) {
		t.Fatalf("250 bytes of 100-byte payloads claimed %v, want %v", got, want)
	}
	if c.Rows[0].Found != 6 {
		t.Fatalf("found %d rows before the byte cut, want 6", c.Rows[0].Found)
	}
	// A lane limit spreads the claim over lanes: 257 and 258 share lanes
	// 1 and 2 with 1 and 2.
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (id, topic, payload) VALUES (257, 'orders', ''), (258, 'orders', '')`)
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 1, Limit: 100, MaxBytes: 1 << 20}, nil)
	if got, want := ids(c.Rows), []int64{1, 257, 2, 258, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v (each lane in id order)", got, want)
	}
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 1, Limit: 100, LaneLimit: 1, MaxBytes: 1 << 20}, nil)
	if got, want := ids(c.Rows), []int64{1, 2, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("lane limit 1 claimed %v, want %v (the first of each lane)", got, want)
	}
	e.exec(`DELETE FROM ` + e.s.Table("messages") + ` WHERE id > 256`)
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 3, Limit: 100, MaxBytes: 1}, nil)
	if got, want := ids(c.Rows), []int64{3}; !slices.Equal(got, want) {
		t.Fatalf("a payload above the byte limit claimed %v, want it alone: %v", got, want)
	}
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 2, Worker: 1, Limit: 100, MaxBytes: 1 << 20, Handover: []int16{3}}, nil)
	if got, want := ids(c.Rows), []int64{1, 5}; !slices.Equal(got, want) {
		t.Fatalf("worker 1 of 2 without lane 3 claimed %v, want %v", got, want)
	}
	// A claim woken about some lanes visits those only (in rotation
	// order), and still skips the lanes being handed over.
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Rotation: 3, Limit: 100, MaxBytes: 1 << 20, Only: []int16{2, 5, 6}, Handover: []int16{6}}, nil)
	if got, want := ids(c.Rows), []int64{5, 2}; !slices.Equal(got, want) {
		t.Fatalf("a claim of lanes 2, 5 and 6 (6 handed over) claimed %v, want %v", got, want)
	}
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 2, Worker: 1, Limit: 100, MaxBytes: 1 << 20, Only: []int16{4}}, nil)
	if len(c.Rows) != 0 {
		t.Fatalf("worker 1 of 2 woken about lane 4 (worker 0's) claimed %v", ids(c.Rows))
	}
	c = e.claim(en, ClaimParams{Relay: "someone else", Workers: 1, Limit: 100, MaxBytes: 1 << 20}, nil)
	if len(c.Rows) != 0 {
		t.Fatalf("a relay without lanes claimed %v", ids(c.Rows))
	}

	// A message waiting for its retry holds back the later ones of its
	// key, and only of its key; the probe sees a priority.
	e.exec(`DELETE FROM ` + e.s.Table("messages"))
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (id, topic, key, payload, available_at, attempts, priority) VALUES
 (10, 'orders', 'a', '', now() + interval '1 hour', 1, 0), (11, 'orders', 'a', '', NULL, 0, 0), (12, 'orders', 'b', '', NULL, 0, 3),
 (13, 'other', 'c', '', NULL, 0, 0)`)
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Limit: 100, MaxBytes: 1 << 20, Topics: []string{"ord%"}}, nil)
	if got, want := ids(c.Rows), []int64{12}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v (11 held back by 10, 13 another topic)", got, want)
	}
	if !c.Priority {
		t.Fatal("the priority probe missed message 12")
	}
	c = e.claim(en, ClaimParams{Relay: "me", Workers: 1, Limit: 100, MaxBytes: 1 << 20, Priority: true, Exclude: []string{"ord%"}}, nil)
	if got, want := ids(c.Rows), []int64{13}; !slices.Equal(got, want) {
		t.Fatalf("priority claim without the orders topics claimed %v, want %v", got, want)
	}
}

func TestSettleDeleteRetryDeadLetter(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (id, topic, payload) SELECT g, 'orders', '' FROM generate_series(1, 3) g`)
	en := NewEngine(e.s, Outbox, "", false)
	e.claim(en, ClaimParams{}, func(b *pgx.Batch, c claim) {
		en.QueueDelete(b, []pgtype.TID{c.Rows[0].CTID})
		en.QueueRetry(b, Retries{Seqs: []int64{2}, DelayMillis: []int64{3_600_000}, Errors: []string{"boom"}})
		en.QueueDeadLetter(b, DeadLetters{Seqs: []int64{3}, Reasons: []string{"permanent"}, Errors: []string{"bad"}})
	})
	if n := e.count(`SELECT count(*) FROM ` + e.s.Table("messages") + ` m WHERE m.id = 2 AND m.attempts = 1 AND m.last_error = 'boom' AND ` + Waiting("m")); n != 1 {
		t.Fatal("the retry was not scheduled")
	}
	if n := e.count(`SELECT count(*) FROM ` + e.s.Table("messages")); n != 1 {
		t.Fatalf("%d messages left, want the retry only", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.s.Table("dead_letters") + ` WHERE id = 3 AND reason = 'permanent' AND route = '' AND attempts = 1`); n != 1 {
		t.Fatal("the dead letter was not moved")
	}
	if c := e.claim(en, ClaimParams{}, nil); len(c.Rows) != 0 {
		t.Fatalf("claimed %v while the only message waits for its retry", ids(c.Rows))
	}
}

// A claim can settle the batch its transaction claimed before (all of it
// delivered) in its own statement: it deletes those rows, and never
// returns them, although the transaction holds their locks. With
// priorities, and for the router, the DELETE goes ahead of the claim.
func TestClaimSettlesTheEarlierBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		src      Source
		priority bool
	}{{"outbox", Outbox, false}, {"priority claim", Outbox, true}, {"router", Router, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupEngine(t)
			msgs := e.s.Table("messages")
			// Keyless messages 1..6 fall in lanes 1..6, 257 in lane 1
			// after 1.
			e.exec(`INSERT INTO ` + msgs + ` (id, topic, payload) SELECT g, 'orders', '' FROM generate_series(1, 6) g`)
			e.exec(`INSERT INTO ` + msgs + ` (id, topic, payload) VALUES (257, 'orders', '')`)
			en := NewEngine(e.s, tc.src, "", false)
			ctx := context.Background()
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			claimIn := func(p ClaimParams) []ClaimedRow {
				var got []ClaimedRow
				var prio bool
				b := &pgx.Batch{}
				p.Relay, p.Workers, p.MaxBytes, p.Priority = "me", 1, 1<<20, tc.priority
				en.QueueClaim(b, p, &prio, func(r ClaimedRow) error { got = append(got, r); return nil })
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					t.Fatal(err)
				}
				return got
			}
			first := claimIn(ClaimParams{Limit: 3, Rotation: 1, Only: []int16{1, 2, 3}})
			if got := ids(first); !slices.Equal(got, []int64{1, 257, 2}) && !slices.Equal(got, []int64{1, 2, 3}) {
				t.Fatalf("first claim %v", got)
			}
			settled := make([]pgtype.TID, len(first))
			for i, r := range first {
				settled[i] = r.CTID
			}
			// Every lane again: the rows of the first batch are the
			// transaction's, locked, and must not come back.
			second := claimIn(ClaimParams{Limit: 100, Rotation: 1, Settle: settled})
			for _, r := range second {
				if slices.Contains(ids(first), r.Seq) {
					t.Fatalf("the settling claim returned %d, a row it deletes (second claim %v)", r.Seq, ids(second))
				}
			}
			if got, want := len(second), 7-len(first); got != want {
				t.Fatalf("second claim %v, want the %d other rows", ids(second), want)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var left []int64
			rows, err := e.pool.Query(ctx, `SELECT id FROM `+msgs+` ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			if left, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				t.Fatal(err)
			}
			if got, want := left, ids(second); !slices.Equal(got, sortedIDs(want)) {
				t.Fatalf("left %v, want the second batch %v (the first deleted)", got, want)
			}
		})
	}
}

func sortedIDs(s []int64) []int64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestFanOutCopiesAndTheirRoute(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (id, topic, key, payload) VALUES (1, 'orders', 'k', 'p')`)
	router := NewEngine(e.s, Router, "", false)
	e.claim(router, ClaimParams{}, func(b *pgx.Batch, c claim) {
		if len(c.Rows) != 1 || len(c.Rows[0].Payload) != 0 {
			t.Fatalf("router claimed %+v, want message 1 without its payload", c.Rows)
		}
		router.QueueCopy(b, CopyParams{Seqs: []int64{1, 1}, Routes: []string{"a", "b"}, CTIDs: []pgtype.TID{c.Rows[0].CTID}})
		router.QueueDelete(b, []pgtype.TID{c.Rows[0].CTID})
	})
	a := NewEngine(e.s, Copies, "a", false)
	if left, err := a.CopiesLeft(ctx, e.pool); err != nil || !left {
		t.Fatalf("CopiesLeft = %v, %v", left, err)
	}
	la := NewLeases(e.s, "me", "a")
	if _, err := la.EnsureLanes(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := la.Acquire(ctx, e.pool, time.Hour, NumLanes); err != nil {
		t.Fatal(err)
	}
	e.claim(a, ClaimParams{}, func(b *pgx.Batch, c claim) {
		if len(c.Rows) != 1 || string(c.Rows[0].Payload) != "p" {
			t.Fatalf("route a claimed %+v, want its copy of message 1", c.Rows)
		}
		a.QueueDeadLetter(b, DeadLetters{Seqs: []int64{1}, Reasons: []string{"permanent"}, Errors: []string{"bad"}})
	})
	if n := e.count(`SELECT count(*) FROM ` + e.s.Table("deliveries") + ` WHERE route = 'b'`); n != 1 {
		t.Fatal("route a's dead letter took route b's copy")
	}
	if n := e.count(`SELECT count(*) FROM ` + e.s.Table("dead_letters") + ` WHERE id = 1 AND route = 'a'`); n != 1 {
		t.Fatal("a copy's dead letter does not record its route")
	}
	if left, err := a.CopiesLeft(ctx, e.pool); err != nil || left {
		t.Fatalf("CopiesLeft = %v, %v after route a's copy went", left, err)
	}
}

// A starting relay creates its route's lane rows in its registration when
// some are missing, and inserts nothing (so waits for no lane row's lock)
// when none are.
func TestEnsureMissingLanes(t *testing.T) {
	t.Parallel()
	pool, s := migrated(t)
	ctx := context.Background()
	l := NewLeases(s, "r1", "x")
	ensure := func() int64 {
		t.Helper()
		b := &pgx.Batch{}
		l.QueueEnsureMissingLanes(b)
		var n int64
		br := pool.SendBatch(ctx, b)
		tag, err := br.Exec()
		if err == nil {
			n = tag.RowsAffected()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := ensure(); n != NumLanes {
		t.Fatalf("on a route without lanes: %d created, want %d", n, NumLanes)
	}
	if n := ensure(); n != 0 {
		t.Fatalf("with every lane there: %d created", n)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+s.Table("lanes")+` WHERE route = 'x' AND lane >= 250`); err != nil {
		t.Fatal(err)
	}
	if n := ensure(); n != 6 {
		t.Fatalf("with 6 lanes missing: %d created", n)
	}
	// Nothing to insert: no wait for a transaction holding a lane row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(ctx, `UPDATE `+s.Table("lanes")+` SET owner = 'r2' WHERE route = 'x' AND lane = 0`); err != nil {
		t.Fatal(err)
	}
	done := make(chan int64, 1)
	go func() { done <- ensure() }()
	select {
	case n := <-done:
		if n != 0 {
			t.Fatalf("%d created", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check for missing lanes waited for a lane row's lock")
	}
}

func TestLeasesAcquireShareRelease(t *testing.T) {
	t.Parallel()
	pool, s := migrated(t)
	ctx := context.Background()
	me, other := NewLeases(s, "r1", "x"), NewLeases(s, "r2", "x")
	if n, err := me.EnsureLanes(ctx, pool); err != nil || n != NumLanes {
		t.Fatalf("EnsureLanes = %d, %v", n, err)
	}
	for _, l := range []*Leases{me, other} {
		if err := l.Heartbeat(ctx, pool, Heartbeat{Hostname: "h", PID: 1, Version: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := other.CountRelays(ctx, pool); err != nil || c != (RelayCount{Alive: 2, Rank: 1, Lanes: NumLanes}) {
		t.Fatalf("CountRelays = %+v, %v", c, err)
	}
	got, err := me.Acquire(ctx, pool, time.Hour, 10)
	if err != nil || !slices.Equal(got, []int16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("Acquire = %v, %v", got, err)
	}
	if got, err := other.Acquire(ctx, pool, time.Hour, 2); err != nil || !slices.Equal(got, []int16{10, 11}) {
		t.Fatalf("the other relay acquired %v, %v", got, err)
	}
	if got, err := me.Renew(ctx, pool, time.Hour); err != nil || len(got) != 10 {
		t.Fatalf("Renew = %v, %v", got, err)
	}
	if n, err := me.WorkedLanes(ctx, pool); err != nil || n != 12 {
		t.Fatalf("WorkedLanes = %d, %v", n, err)
	}
	if got, err := me.Release(ctx, pool, []int16{0, 1, 10}); err != nil || !slices.Equal(got, []int16{0, 1}) {
		t.Fatalf("Release = %v, %v (lane 10 is not mine)", got, err)
	}
	if err := me.ReleaseAll(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if got, err := me.Owned(ctx, pool); err != nil || len(got) != 0 {
		t.Fatalf("Owned = %v, %v after ReleaseAll", got, err)
	}
	// Every other heartbeat is older than now + 1h: r2 goes, r1 stays.
	if _, err := me.Reap(ctx, pool, -time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if err := me.ClampHeartbeats(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if c, err := me.CountRelays(ctx, pool); err != nil || c.Alive != 1 {
		t.Fatalf("after the reap CountRelays = %+v, %v", c, err)
	}
	if n, err := me.WorkedLanes(ctx, pool); err != nil || n != 0 {
		t.Fatalf("a reaped relay's lanes still count as worked: %d, %v", n, err)
	}
	if err := me.Unregister(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if c, err := me.CountRelays(ctx, pool); err != nil || c.Alive != 0 {
		t.Fatalf("after Unregister CountRelays = %+v, %v", c, err)
	}
}

func TestArchivePartitions(t *testing.T) {
	t.Parallel()
	pool, s := migrated(t)
	ctx := context.Background()
	p := NewPartitions(s)
	day := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := p.Lock(ctx, tx); err != nil {
			return err
		}
		for range 2 { // idempotent
			if err := p.Create(ctx, tx, day); err != nil {
				return err
			}
		}
		names, err := p.List(ctx, tx)
		if err != nil {
			return err
		}
		if !slices.Contains(names, PartitionName(day)) {
			t.Errorf("List = %v, without %s", names, PartitionName(day))
		}
		return p.Drop(ctx, tx, PartitionName(day))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkClaimRewrite measures what named arguments would add to every
// claim if pgx rewrote them at each call (pgx.NamedArgs), against the
// statement rendered once (stmt.args). Compare with BenchmarkClaim in
// package relay (the claim's round trip, milliseconds).
func BenchmarkClaimRewrite(b *testing.B) {
	s, err := NewSchema("")
	if err != nil {
		b.Fatal(err)
	}
	e := NewEngine(s, Outbox, "", false)
	args := func() pgx.NamedArgs {
		return pgx.NamedArgs{
			"relay": "me", "workers": 2, "worker": 0, "rotation": 0, "limit": 500, "lane_limit": 500, "route": "",
			"max_bytes": int64(1 << 24), "max_message": int64(17 << 20), "topics": []string(nil), "exclude": []string(nil), "handover": []int16{},
		}
	}
	for _, st := range []struct {
		name string
		stmt stmt
	}{{"plain", e.claim}, {"priority", e.claimPriority}} {
		b.Run(st.name+"/each-call", func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				if _, _, err := args().RewriteQuery(ctx, nil, st.stmt.named, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(st.name+"/rendered-once", func(b *testing.B) {
			for b.Loop() {
				_ = st.stmt.args(args())
			}
		})
	}
}

// Rendering once must give what pgx gives at each call.
func TestStmtMatchesNamedArgs(t *testing.T) {
	t.Parallel()
	e := NewEngine(testSchema(t), Copies, "orders", false)
	a := pgx.NamedArgs{
		"relay": "me", "workers": 2, "worker": 1, "rotation": 7, "limit": 500, "lane_limit": 62, "route": "orders",
		"max_bytes": int64(99), "max_message": int64(1000), "topics": []string{"a%"}, "exclude": []string(nil), "handover": []int16{3}, "lanes": []int16{3, 4},
	}
	for _, st := range []stmt{e.claim, e.claimPriority, e.hasPriority} {
		sql, want, err := a.RewriteQuery(context.Background(), nil, st.named, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sql != st.sql {
			t.Fatalf("rendered\n%s\npgx\n%s", st.sql, sql)
		}
		if got := st.args(a); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("arguments %v, pgx %v", got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a missing argument was sent as NULL")
		}
	}()
	e.claim.args(pgx.NamedArgs{"relay": "me"})
}

// The claim's plan stays narrow whatever the shape of the backlog and the
// share of lanes a worker owns: the generic plan (what a prepared claim
// ends up with) reads a bounded number of pages, never the whole index.
// With -v the plans are logged.
// claimArgs are the arguments of the claim statement st for relay "me" in
// route "": worker of workers visiting only (nil: every lane of the
// worker), a 500-row batch, no topic filter, nothing handed over.
func claimArgs(st stmt, workers, worker int, only []int16, settle ...pgtype.TID) []any {
	return st.args(pgx.NamedArgs{"relay": "me", "workers": workers, "worker": worker, "rotation": 0,
		"limit": 500, "lane_limit": 500, "max_bytes": int64(16 << 20), "max_message": int64(17 << 20), "topics": []string(nil), "exclude": []string(nil),
		"handover": []int16{}, "route": "", "lanes": ClaimParams{Workers: workers, Worker: worker, Only: only}.lanes(), "settle": settle})
}

// executeClaimPlan executes the prepared claim_plan with n arguments.
// EXECUTE takes no bind parameters: run it in the simple protocol, where
// pgx inlines them as literals.
func executeClaimPlan(n int) string {
	placeholders := make([]string, n)
	for i := range placeholders {
		placeholders[i] = fmt.Sprintf("$%d", i+1)
	}
	return `EXECUTE claim_plan(` + strings.Join(placeholders, ", ") + `)`
}

// explainGeneric runs st once in tx as the relay plans it (its generic
// plan, under NoSeqScan, as every claim) and returns the lines of its
// EXPLAIN (ANALYZE, BUFFERS).
func explainGeneric(t *testing.T, tx pgx.Tx, st stmt, args []any) []string {
	t.Helper()
	ctx := context.Background()
	for _, set := range []string{`SET LOCAL plan_cache_mode = force_generic_plan`, NoSeqScan, `PREPARE claim_plan AS ` + st.sql} {
		if _, err := tx.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	defer tx.Exec(ctx, `DEALLOCATE claim_plan`) //nolint:errcheck // the session goes back to the pool
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) `+executeClaimPlan(len(args)),
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// scanOfClaim matches a plan line that scans the outbox for the claim
// itself (alias m or m_n), with its rows and loops.
var scanOfClaim = regexp.MustCompile(`(?:Scan|Scan using \S+) on messages m(?:_\d+)? \(actual rows=(\d+) loops=(\d+)\)`)

func TestClaimPlanStaysNarrow(t *testing.T) {
	t.Parallel()
	// load fills a fresh schema: 60,000 messages over 1,000 keys and one
	// hot key of 10,000 in one lane, then setup (committed), then ANALYZE.
	load := func(setup string) (*engineEnv, int) {
		e := setupEngine(t)
		msgs := e.s.Table("messages")
		e.exec(`INSERT INTO ` + msgs + ` (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 60000) g`)
		e.exec(`INSERT INTO ` + msgs + ` (topic, key, payload)
SELECT 'orders', 'hot', convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 10000) g`)
		if setup != "" {
			e.exec(strings.ReplaceAll(setup, "MESSAGES", msgs))
		}
		e.exec(`VACUUM ANALYZE ` + msgs)
		var hotLane int
		if err := e.pool.QueryRow(context.Background(), `SELECT lane FROM `+msgs+` WHERE key = 'hot' LIMIT 1`).Scan(&hotLane); err != nil {
			t.Fatal(err)
		}
		return e, hotLane
	}
	type scenario struct {
		name            string
		workers, worker int
		hotLane         bool   // worker is the one whose lanes hold the hot key
		setup           string // committed before the claim
		priority        bool
		only            []int16 // the lanes a wake-up named
		settle          bool    // the claim deletes 100 rows of an earlier batch
		want            int
	}
	scenarios := []scenario{
		{name: "1 worker", workers: 1, want: 500},
		{name: "2 workers", workers: 2, want: 500},
		{name: "16 workers", workers: 16, want: 500},
		{name: "64 workers", workers: 64, want: 500},
		{name: "woken lanes", workers: 2, only: []int16{0, 2, 4, 6, 8, 10}, want: 500},
		{name: "settling an earlier batch", workers: 2, settle: true, want: 500},
		{name: "one hot key", workers: 256, hotLane: true, want: 500},
		{name: "retries waiting", workers: 2, want: 500,
			setup: `UPDATE MESSAGES SET available_at = now() + interval '1 hour', attempts = 1 WHERE id % 10 = 0 AND key <> 'hot'`},
		{name: "delayed messages", workers: 2, want: 500,
			setup: `UPDATE MESSAGES SET available_at = now() + interval '1 hour' WHERE id % 5 = 1`},
		// Keys k0 and k2 hold priority messages; of them only k0 (60
		// messages) is in a lane of worker 0: the batch is k0's messages.
		{name: "priorities", workers: 2, priority: true, want: 60,
			setup: `UPDATE MESSAGES SET priority = 5 WHERE id IN (30000, 30002, 50000)`},
	}
	base, baseHot := load("")
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			e, hot := base, baseHot
			if sc.setup != "" {
				e, hot = load(sc.setup)
			}
			if sc.hotLane {
				sc.worker = hot % sc.workers
			}
			ctx := context.Background()
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			en := NewEngine(e.s, Outbox, "", false)
			st := en.claim
			if sc.priority {
				st = en.claimPriority
			}
			args := claimArgs(st, sc.workers, sc.worker, sc.only)
			if sc.settle {
				// The first 100 rows of the worker's lanes, claimed
				// earlier in the transaction.
				rows, err := tx.Query(ctx, `SELECT ctid FROM `+e.s.Table("messages")+` WHERE lane % 2 = 0 ORDER BY id LIMIT 100 FOR UPDATE`)
				if err != nil {
					t.Fatal(err)
				}
				settled, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.TID])
				if err != nil {
					t.Fatal(err)
				}
				st = en.claimSettle
				args = claimArgs(st, sc.workers, sc.worker, sc.only, settled...)
			}
			plan := explainGeneric(t, tx, st, args)
			t.Logf("%s:\n%s", sc.name, strings.Join(plan, "\n"))
			// The rows claimed (the top node's) and the outbox rows the
			// claim read (scans of the claim's own alias, m or m_n, with
			// what their filters removed; the held-back probe w is not
			// counted: it reads an index that is empty unless something
			// is failing).
			var got, read int
			loops := 0
			for _, l := range plan {
				if got == 0 {
					if i := strings.Index(l, "rows="); i >= 0 {
						fmt.Sscanf(l[i:], "rows=%d", &got)
					}
				}
				if m := scanOfClaim.FindStringSubmatch(l); m != nil {
					var rows int
					fmt.Sscanf(m[1], "%d", &rows)
					fmt.Sscanf(m[2], "%d", &loops)
					read += rows * loops
					continue
				}
				if strings.Contains(l, "->") {
					loops = 0
				}
				if i := strings.Index(l, "Rows Removed by Filter: "); i >= 0 && loops > 0 {
					var removed int
					fmt.Sscanf(l[i:], "Rows Removed by Filter: %d", &removed)
					read += removed * loops
				}
			}
			t.Logf("%s: claimed %d rows, read %d outbox rows", sc.name, got, read)
			if got != sc.want {
				t.Errorf("claimed %d rows, want %d", got, sc.want)
			}
			// Breadth reads at most the batch plus one row a lane, depth
			// at most the batch: never the rest of the backlog.
			if limit := 2*500 + NumLanes; read > limit {
				t.Errorf("claim read %d outbox rows, want at most %d", read, limit)
			}
		})
	}
}

// Most of the time the outbox holds few live rows and many dead ones:
// delivered rows stay in the table and its indexes until a vacuum. A claim
// planned for that must walk a lane's index in id order (it stops at the
// first deliverable row and marks the dead entries it passes, so the next
// claim skips them), not read the lane as a bitmap scan and a sort, which
// fetches the heap tuple of every dead row of the lane at every claim and
// marks nothing (measured in a relay beside 16 writers: 99 buffers a
// claimed row instead of 14). And it reads lane rows by their key, only
// for lanes that hold a deliverable row, instead of scanning the lanes
// table (every heartbeat rewrites its rows).
func TestClaimPlanOnDeadRows(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	msgs := e.s.Table("messages")
	fill := func(n int) {
		e.exec(`INSERT INTO `+msgs+` (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $1::int) g`, n)
	}
	// 40,000 delivered rows, not vacuumed; statistics taken (as
	// autovacuum's ANALYZE would) while ten rows a lane were live; then
	// those delivered too, and a few live rows.
	fill(40000)
	e.exec(`DELETE FROM ` + msgs)
	fill(2560)
	e.exec(`ANALYZE ` + msgs)
	e.exec(`DELETE FROM ` + msgs)
	fill(300)

	en := NewEngine(e.s, Outbox, "", false)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	plan := explainGeneric(t, tx, en.claim, claimArgs(en.claim, 2, 0, nil))
	text := strings.Join(plan, "\n")
	t.Logf("claim of a small outbox among dead rows:\n%s", text)
	var got int
	if i := strings.Index(text, "rows="); i >= 0 {
		fmt.Sscanf(text[i:], "rows=%d", &got)
	}
	if got == 0 {
		t.Fatal("the claim took nothing")
	}
	if strings.Contains(text, "Bitmap") {
		t.Error("the claim reads the outbox or the lanes with a bitmap scan")
	}
	for _, l := range plan {
		if strings.Contains(l, " on lanes") && !strings.Contains(l, "Index Scan using lanes_pkey on lanes k") {
			t.Errorf("the claim reads the lanes table other than by a lane's key: %s", strings.TrimSpace(l))
		}
	}
}

// A relay plans its claim once (a generic plan), mostly while the outbox
// is nearly empty; the plan must still read only what it claims when a
// backlog comes and no ANALYZE has run since. Planned with sequential
// scans on the empty table, the held-back check scanned the whole table
// once per claimed row: 44 s for one claim of a 200k backlog.
func TestClaimPlannedOnAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	en := NewEngine(e.s, Outbox, "", false)
	args := claimArgs(en.claim, 2, 0, nil)
	execute := executeClaimPlan(len(args))
	if _, err := conn.Exec(ctx, `PREPARE claim_plan AS `+en.claim.sql); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `DEALLOCATE claim_plan`) //nolint:errcheck // the session goes back to the pool
	// Each claim in its own transaction, as the relay runs them: the
	// generic plan is made at the first, on the empty outbox, and kept.
	claim := func(explain bool) []string {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		for _, set := range []string{`SET LOCAL plan_cache_mode = force_generic_plan`, NoSeqScan} {
			if _, err := tx.Exec(ctx, set); err != nil {
				t.Fatal(err)
			}
		}
		q := execute
		if explain {
			q = `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) ` + execute
		}
		rows, err := tx.Query(ctx, q, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			if explain {
				var l string
				if err := rows.Scan(&l); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, l)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	claim(false)
	e.exec(`INSERT INTO ` + e.s.Table("messages") + ` (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 50000) g`)
	plan := claim(true)
	var got, hit int
	for _, l := range plan {
		if i := strings.Index(l, "rows="); i >= 0 && got == 0 {
			fmt.Sscanf(l[i:], "rows=%d", &got)
		}
		if i := strings.Index(l, "Buffers: shared hit="); i >= 0 && hit == 0 {
			fmt.Sscanf(l[i:], "Buffers: shared hit=%d", &hit)
		}
	}
	t.Logf("claimed %d rows, %d buffers:\n%s", got, hit, strings.Join(plan, "\n"))
	if got != 500 {
		t.Errorf("claimed %d rows, want 500", got)
	}
	// About two buffers a row (its heap page and the index): 50,000
	// rows' worth would be a scan of the backlog.
	if hit > 5000 {
		t.Errorf("the claim of 500 rows touched %d buffers: its plan scans the backlog", hit)
	}
}

// The watcher's looks are prepared statements as well, on its session
// under NoSeqScan's settings, planned mostly while the outbox is empty,
// and must stay narrow when a backlog comes with no ANALYZE since. On an
// empty outbox Postgres plans the look for the gaps' rows as a scan of
// the whole (lane, id) index (an index-only scan costs least there):
// with a backlog, 540 ms a look and the heap tuple of every row, for a
// relay that was running when 200k rows were committed, its watcher's
// session busy for as long as the backlog lasted. Counted here by the
// index entries the looks read.
func TestLooksPlannedOnAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Skipf("PostgreSQL %d has no pg_stat_force_next_flush (15+ has): the looks' index reads cannot be counted when they end", version)
	}
	w := NewWaker(e.s)
	if err := w.PrepareLooks(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// The plans Postgres would settle on after five looks, at once.
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	msgs := e.s.Table("messages")
	gapsFrom := func(first int64) []int64 {
		gaps := make([]int64, 64) // maxGaps
		for i := range gaps {
			gaps[i] = first + 20000 + int64(i)*7
		}
		return gaps
	}
	looks := func(first int64) {
		t.Helper()
		for _, gaps := range [][]int64{nil, gapsFrom(first)} {
			if _, err := w.NewRows(ctx, conn, first, gaps, 128); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.Due(ctx, conn, time.Now().Add(-time.Minute).UnixMicro()); err != nil {
			t.Fatal(err)
		}
	}
	// Index entries read so far, once this session's counts are out.
	read := func() (n int64) {
		t.Helper()
		if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
WHERE schemaname = $1 AND relname = 'messages' AND indexrelname <> 'messages_pkey'`, e.s.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	looks(0) // planned on the empty outbox
	e.exec(`INSERT INTO ` + msgs + ` (topic, key, payload)
SELECT 'orders', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 50000) g`)
	var first int64
	if err := conn.QueryRow(ctx, `SELECT min(id) FROM `+msgs).Scan(&first); err != nil {
		t.Fatal(err)
	}
	before := read()
	looks(first)
	// The looks read 10,000 new rows and the 64 gaps' by the primary key;
	// a scan of another index reads all 50,000 of its entries.
	if got := read() - before; got > 1000 {
		t.Errorf("the looks on a 50k backlog read %d entries of the outbox's other indexes: a plan made on the empty outbox scans one whole", got)
	}
}

// A settlement runs as a prepared statement, planned once, mostly while
// the outbox is empty: there Postgres finds ids through the (lane, id)
// index as readily as through the primary key (m.id = ANY(@ids) was
// planned so), and such a plan reads the whole index for each batch once
// a backlog came. Each statement must reach its rows by their key or
// their ctid. (Relock, which settles a refused batch again row by row,
// names them as m.id = ANY(@ids) and is planned afresh each time.)
func TestSettlementsPlannedOnAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	engines := map[string]*Engine{
		"outbox":       NewEngine(e.s, Outbox, "", false),
		"outbox, hold": NewEngine(e.s, Outbox, "", true),
		"copies":       NewEngine(e.s, Copies, "orders", false),
		"copies, hold": NewEngine(e.s, Copies, "orders", true),
	}
	ids := []int64{1, 2, 3}
	for name, en := range engines {
		for _, st := range []struct {
			what string
			st   stmt
			args pgx.NamedArgs
		}{
			{"archive", en.archiveDelivered, pgx.NamedArgs{"ctids": []pgtype.TID{{BlockNumber: 0, OffsetNumber: 1, Valid: true}}}},
			{"retry", en.scheduleRetry, pgx.NamedArgs{"ids": ids, "delay_ms": []int64{1, 1, 1}, "errors": []string{"a", "b", "c"}}},
			{"defer", en.deferRows, pgx.NamedArgs{"ids": ids, "delay_ms": []int64{1, 1, 1}, "errors": []string{"a", "b", "c"}}},
			{"dead letter", en.deadLetter, pgx.NamedArgs{"ids": ids, "reasons": []string{"a", "b", "c"}, "errors": []string{"a", "b", "c"}}},
		} {
			func() {
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // nothing of it is kept
				plan := explainGeneric(t, tx, st.st, en.args(st.st, st.args))
				if text := strings.Join(plan, "\n"); strings.Contains(text, "lane_id_idx") {
					t.Errorf("%s, %s: planned on an empty outbox, it reads the (lane, id) index:\n%s", name, st.what, text)
				}
			}()
		}
	}
}

// NoSeqScan prices sequential scans out of the plans with a huge cost;
// a statement that cannot avoid one (the relays table read whole) then
// cost more than jit_above_cost, and Postgres compiled it, 100 ms each
// time (it delayed the watcher's wake-ups). The setting turns JIT off
// with it.
func TestNoSeqScanCompilesNothing(t *testing.T) {
	t.Parallel()
	e := setupEngine(t)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// Whatever the server's defaults, JIT is on for this transaction
	// until NoSeqScan says otherwise.
	if _, err := tx.Exec(ctx, `SET LOCAL jit = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, NoSeqScan); err != nil {
		t.Fatal(err)
	}
	var plan string
	if err := tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT count(*) FROM `+e.s.Table("relays")+` WHERE hostname <> 'x'`).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, `"Total Cost": 1000000`) {
		t.Fatalf("expected a sequential scan priced out by the setting: %s", plan)
	}
	var jit string
	if err := tx.QueryRow(ctx, `SHOW jit`).Scan(&jit); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Fatalf("jit = %s inside a transaction that ran NoSeqScan", jit)
	}
	var analyzed string
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM `+e.s.Table("relays")+` WHERE hostname <> 'x'`).Scan(&analyzed); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(analyzed, `"JIT"`) {
		t.Fatalf("the statement was compiled: %s", analyzed)
	}
}

// WALState reads the catalog: on a server whose wal_level is not logical
// (the shared test server), a publication that does not exist.
func TestWALStateOfAMissingPublication(t *testing.T) {
	t.Parallel()
	pool, s := migrated(t)
	ctx := context.Background()
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	st, err := NewWaker(s).WALState(ctx, pool, "no_such_publication_"+s.Name())
	if err != nil {
		t.Fatal(err)
	}
	if st.Logical != (level == "logical") || st.Published || st.Covers || st.ServerVersion < 100000 {
		t.Fatalf("WALState = %+v with wal_level %s and no publication", st, level)
	}
}

// LaneOf computes in Go the lane the messages table's generated column
// computes (the WAL wake-up wakes lanes from the stream's keys with it).
func TestLaneOfMatchesTheLaneColumn(t *testing.T) {
	t.Parallel()
	pool, name := pgtest.Schema(t)
	ctx := context.Background()
	keys := []*string{nil}
	for _, k := range []string{"", "k", "order-42", "é", "ключ", "键", strings.Repeat("x", 200), "a'b\"c"} {
		keys = append(keys, &k)
	}
	for i, key := range keys {
		var id int64
		var lane int
		err := pool.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{name, "messages"}.Sanitize()+` (topic, key, payload) VALUES ('t', $1, '\x00') RETURNING id, lane`, key).Scan(&id, &lane)
		if err != nil {
			t.Fatal(err)
		}
		if got := LaneOf(id, key); got != lane {
			t.Errorf("key %d: LaneOf(%d, …) = %d, the column says %d", i, id, got, lane)
		}
	}
}
