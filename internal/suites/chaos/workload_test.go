package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// workload is the application: concurrent transactions that each change
// business rows and write outbox messages for them, some of which roll
// back.
//
// Same-key writers serialize. Every transaction locks the accounts rows of
// its keys (SELECT … ORDER BY key FOR UPDATE, in key order so writers never
// deadlock) before it writes their messages, and takes each message's seq
// from that row. This is what an application must do for "per-key order"
// to mean write order: the relay publishes a key's messages in outbox id
// order, ids are assigned at insert and rows become visible at commit, so
// two unserialized transactions writing the same key can commit in the
// opposite order of their ids (the commit-order caveat). With the row lock,
// id order, commit order and seq order agree for every key.
//
// The seq of a rolled-back transaction is reused by the next transaction
// on that key (the accounts update rolls back too), so committed seqs per
// key are exactly 1..N. Each message also carries a tag unique to the
// transaction attempt that wrote it; tags of rolled-back transactions must
// never reach the receiver.
type workload struct {
	pool   *pgxpool.Pool
	w      *outbox.Writer
	schema string
	keys   []string
	// rate caps the messages written per second (committed or not), so the
	// writes span the whole chaos schedule. Zero: as fast as possible.
	rate float64
	// rollbackEvery: one transaction in rollbackEvery rolls back.
	rollbackEvery int
	seed          uint64
	// source, when set, goes into every payload: the database written to,
	// where a test writes in several.
	source string

	written, committed atomic.Int64 // messages
	txCommitted        atomic.Int64
	txRolledBack       atomic.Int64
	txFailed           atomic.Int64 // errors before commit: not committed
	txAmbiguous        atomic.Int64 // commit returned an error: the orders table decides

	paceMu    sync.Mutex
	paceStart time.Time
	paced     int64

	mu         sync.Mutex
	rolledBack map[string]bool  // tags of deliberately rolled-back messages
	amounts    map[string]int64 // every message's amount by tag, written or not
	errs       []string
}

func (wl *workload) table(name string) string { return migrations.Ident(wl.schema) + "." + name }

// newWorkload creates the business tables in schema on the database at
// databaseURL and one accounts row per key.
func newWorkload(t *testing.T, databaseURL, schema string, nkeys int, rate float64, seed uint64) *workload {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("database URL: %v", err)
	}
	cfg.MaxConns = 10
	cfg.ConnConfig.RuntimeParams["application_name"] = "chaos-app-" + schema
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	wl := &workload{pool: pool, w: w, schema: schema, rate: rate, rollbackEvery: 10, seed: seed, rolledBack: map[string]bool{}, amounts: map[string]int64{}}
	for i := range nkeys {
		wl.keys = append(wl.keys, fmt.Sprintf("k%04d", i))
	}
	_, err = pool.Exec(ctx, `
CREATE TABLE `+wl.table("accounts")+` (key text PRIMARY KEY, seq integer NOT NULL DEFAULT 0);
CREATE TABLE `+wl.table("orders")+` (tag text PRIMARY KEY, key text NOT NULL, seq integer NOT NULL, UNIQUE (key, seq));`)
	if err != nil {
		t.Fatalf("business tables: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+wl.table("accounts")+` (key) SELECT unnest($1::text[])`, wl.keys); err != nil {
		t.Fatalf("accounts: %v", err)
	}
	return wl
}

// run writes with n concurrent writers until until() says stop (checked
// between transactions) or ctx ends.
func (wl *workload) run(ctx context.Context, n int, until func() bool) {
	wl.paceStart = time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { wl.writer(ctx, i, until) })
	}
	wg.Wait()
}

func (wl *workload) writer(ctx context.Context, id int, until func() bool) {
	rng := rand.New(rand.NewPCG(wl.seed, uint64(id)))
	for txn := 0; ctx.Err() == nil && !until(); txn++ {
		// 1-3 distinct keys, 1-5 messages each: about 6 messages.
		nk := 1 + rng.IntN(3)
		keys := make([]string, 0, nk)
		for len(keys) < nk {
			k := wl.keys[rng.IntN(len(wl.keys))]
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		counts := make([]int32, nk)
		total := 0
		for i := range counts {
			counts[i] = int32(1 + rng.IntN(5))
			total += int(counts[i])
		}
		rollback := rng.IntN(wl.rollbackEvery) == 0
		wl.pace(ctx, total)
		tag := fmt.Sprintf("w%d.%d", id, txn)
		wl.written.Add(int64(total))
		tags, err := wl.txn(ctx, tag, keys, counts, rollback)
		switch {
		case err == nil && rollback:
			wl.txRolledBack.Add(1)
			wl.mu.Lock()
			for _, t := range tags {
				wl.rolledBack[t] = true
			}
			wl.mu.Unlock()
		case err == nil:
			wl.txCommitted.Add(1)
			wl.committed.Add(int64(total))
		default:
			if ctx.Err() != nil {
				return
			}
			if _, ok := err.(ambiguousError); ok {
				wl.txAmbiguous.Add(1)
			} else {
				wl.txFailed.Add(1)
			}
			wl.mu.Lock()
			if len(wl.errs) < 10 {
				wl.errs = append(wl.errs, fmt.Sprintf("%s: %v", tag, err))
			}
			wl.mu.Unlock()
			sleepCtx(ctx, 50*time.Millisecond) // the database may be restarting
		}
	}
}

// ambiguousError is a failed COMMIT: the transaction may or may not have
// committed.
type ambiguousError struct{ error }

// txn is one application transaction: lock the keys' accounts rows, bump
// their seqs, insert the business rows and write the messages, then commit
// or roll back. It returns the messages' tags.
func (wl *workload) txn(ctx context.Context, tag string, keys []string, counts []int32, rollback bool) ([]string, error) {
	tx, err := wl.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, `SELECT key, seq FROM `+wl.table("accounts")+` WHERE key = ANY($1) ORDER BY key FOR UPDATE`, keys)
	if err != nil {
		return nil, err
	}
	cur := map[string]int{}
	for rows.Next() {
		var k string
		var s int
		if err := rows.Scan(&k, &s); err != nil {
			rows.Close()
			return nil, err
		}
		cur[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var (
		msgs []outbox.Message
		tags []string
		oKey []string
		oSeq []int32
	)
	total := 0
	for _, c := range counts {
		total += int(c)
	}
	var sum int64
	for i, k := range keys {
		for j := range int(counts[i]) {
			p := payload{Key: k, Seq: cur[k] + 1 + j, Tag: fmt.Sprintf("%s.%d", tag, len(msgs)), Source: wl.source}
			// A transfer: every message but the last moves an amount
			// derived from its tag, the last balances the transaction.
			if len(msgs) < total-1 {
				p.Amount = int64(crc32.ChecksumIEEE([]byte(p.Tag))%1001) - 500
				sum += p.Amount
			} else {
				p.Amount = -sum
			}
			wl.mu.Lock()
			wl.amounts[p.Tag] = p.Amount
			wl.mu.Unlock()
			body, _ := json.Marshal(p)
			msgs = append(msgs, outbox.Message{Topic: "chaos.orders", Key: k, Payload: body,
				Headers: map[string]string{"content-type": "application/json"}})
			tags = append(tags, p.Tag)
			oKey = append(oKey, k)
			oSeq = append(oSeq, int32(p.Seq))
		}
	}
	if _, err := tx.Exec(ctx, `
WITH u AS (
    UPDATE `+wl.table("accounts")+` a SET seq = a.seq + v.n
    FROM unnest($1::text[], $2::int[]) AS v(key, n) WHERE a.key = v.key
)
INSERT INTO `+wl.table("orders")+` (tag, key, seq) SELECT * FROM unnest($3::text[], $4::text[], $5::int[])`,
		keys, counts, tags, oKey, oSeq); err != nil {
		return nil, err
	}
	if err := wl.w.Write(ctx, tx, msgs...); err != nil {
		return nil, err
	}
	if rollback {
		return tags, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, ambiguousError{err}
	}
	return tags, nil
}

// pace holds a writer back so that the messages written so far stay within
// rate × elapsed time. It shapes the load; it waits for no condition.
func (wl *workload) pace(ctx context.Context, n int) {
	if wl.rate <= 0 {
		return
	}
	wl.paceMu.Lock()
	wl.paced += int64(n)
	due := wl.paceStart.Add(time.Duration(float64(wl.paced) / wl.rate * float64(time.Second)))
	wl.paceMu.Unlock()
	if d := time.Until(due); d > 0 {
		sleepCtx(ctx, d)
	}
}

func (wl *workload) rolledBackTags() map[string]bool {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return wl.rolledBack
}

// amount returns the amount of the message tagged tag.
func (wl *workload) amount(tag string) int64 {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return wl.amounts[tag]
}

func (wl *workload) errors() []string {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]string(nil), wl.errs...)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// committedMsg is a message whose transaction committed, from the orders
// table (the truth, whatever the writers' COMMITs answered).
type committedMsg struct {
	key string
	seq int
}

// committedMessages reads every committed message and checks that the
// workload kept its own invariant: per key, seqs 1..N with N the accounts
// row's seq.
func (wl *workload) committedMessages(ctx context.Context, t *testing.T) map[string]committedMsg {
	t.Helper()
	out := map[string]committedMsg{}
	rows, err := wl.pool.Query(ctx, `SELECT tag, key, seq FROM `+wl.table("orders"))
	if err != nil {
		t.Fatalf("read orders: %v", err)
	}
	maxSeq := map[string]int{}
	count := map[string]int{}
	for rows.Next() {
		var tag string
		var m committedMsg
		if err := rows.Scan(&tag, &m.key, &m.seq); err != nil {
			t.Fatalf("read orders: %v", err)
		}
		out[tag] = m
		maxSeq[m.key] = max(maxSeq[m.key], m.seq)
		count[m.key]++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read orders: %v", err)
	}
	acc, err := wl.pool.Query(ctx, `SELECT key, seq FROM `+wl.table("accounts"))
	if err != nil {
		t.Fatalf("read accounts: %v", err)
	}
	accounts, err := pgx.CollectRows(acc, pgx.RowToStructByPos[struct {
		Key string
		Seq int
	}])
	if err != nil {
		t.Fatalf("read accounts: %v", err)
	}
	for _, a := range accounts {
		if count[a.Key] != a.Seq || maxSeq[a.Key] != a.Seq {
			t.Fatalf("workload invariant broken for key %s: accounts.seq %d, %d orders up to seq %d", a.Key, a.Seq, count[a.Key], maxSeq[a.Key])
		}
	}
	return out
}
