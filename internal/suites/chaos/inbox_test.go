package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/redisinbox"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestChaosInbox is the consumer half end to end. Writers commit money
// transfers through the outbox (each transaction locks the accounts it
// touches and writes one posting per account, the postings summing to
// zero; one transaction in ten rolls back); relay processes publish them
// into a Redis stream and are SIGKILLed at random, their database
// sessions ended mid-batch, so batches are added to the stream again:
// duplicates that arrive after later messages of their keys. A consumer
// reads the stream through the inbox (redisinbox.HandleBatch) and applies
// each posting to its own balances table; it is killed too, at random,
// either mid-transaction or after its commit and before its XACK, and a
// new consumer claims what it left pending.
//
// At the end every balance in the consumer's database equals the sum of
// the committed postings of its account, exactly; each account's
// postings were applied in write order (its writer-side seqs 1..N, in
// order, none twice, none rolled back); and the inbox absorbed
// duplicates (the test fails when there were none: it would prove
// nothing).
func TestChaosInbox(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the inbox chaos test in -short mode: it runs relay processes for about 20 s")
	}
	seed := chaosSeed(t)
	t.Logf("seed %d (CHAOS_SEED reproduces the random choices)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x1B0C))
	messages, writeFor := int64(4_000), 10*time.Second
	if os.Getenv("CHAOS_LONG") == "1" {
		messages, writeFor = 30_000, 60*time.Second
	}
	const keys, writers, relays = 200, 6, 3

	srv := throwaway.Redis(t)
	ctx, cancel := testContext(t)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	const stream, group = "chaos.orders", "bank"
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	// As in TestChaosRedis: answers held back, so a SIGKILL often lands
	// between the server adding a batch and the relay's commit.
	lag := newLagProxy(t, srv.Addr(), 40*time.Millisecond)

	pool, schema := pgtest.Schema(t)
	wl := newWorkload(t, pgtest.URL(), schema, keys, float64(messages)/0.9/writeFor.Seconds(), seed)
	b := newBank(t, pool, schema+"_bank")

	// The consumer's kills draw from their own generator: the relays'
	// kills draw from rng in another goroutine.
	consumers := b.consume(ctx, t, rand.New(rand.NewPCG(seed, 0xC0)), rdb, stream, group)
	c := newCluster(t, relayBinary(t), pgtest.URL(), schema, relayArgs("redis://"+lag.addr()+"/0"))
	terminated, drained := killsWhileWriting(ctx, t, rng, pool, c, relays, wl, writers, messages)

	// The relays are done; the consumer (still killed now and then) must
	// get through the whole stream. at is where the group stands.
	var at string
	caughtUp := func() (bool, string) {
		info, err := rdb.XInfoStream(ctx, stream).Result()
		if err != nil {
			return false, err.Error()
		}
		groups, err := rdb.XInfoGroups(ctx, stream).Result()
		if err != nil || len(groups) != 1 {
			return false, fmt.Sprintf("groups %v: %v", groups, err)
		}
		g := groups[0]
		at = fmt.Sprintf("%s/%d", g.LastDeliveredID, g.Pending)
		return g.LastDeliveredID == info.LastGeneratedID && g.Pending == 0,
			fmt.Sprintf("stream at %s, group at %s with %d pending", info.LastGeneratedID, g.LastDeliveredID, g.Pending)
	}
	// The consumers are killed after every few reads; the group must keep
	// moving until it is through. A bound on a stall, not a measure: a
	// fixed minute and 2 ms a posting ran out on a machine running long
	// fault tests beside the suite, the group 3 s of the stream behind and
	// still moving.
	const stall = time.Minute
	moved, last := time.Now(), ""
	for {
		ok, why := caughtUp()
		if ok {
			break
		}
		if at != last {
			moved, last = time.Now(), at
		}
		if time.Since(moved) > stall || b.failed.Load() {
			t.Fatalf("the consumer did not catch up (the group has not moved for %s): %s", time.Since(moved).Round(time.Second), why)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	stats := consumers.stop()
	entries, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		t.Fatalf("XLEN: %v", err)
	}

	committed := wl.committedMessages(ctx, t)
	want := map[string]int64{}
	wantSeqs := map[string]int{}
	var total int64
	for tag, m := range committed {
		want[m.key] += wl.amount(tag)
		wantSeqs[m.key]++
		total += wl.amount(tag)
	}
	if total != 0 {
		t.Errorf("the committed transfers sum to %d, not 0: the workload's amounts are wrong", total)
	}
	got := b.balances(ctx, t)
	var sum int64
	for _, k := range wl.keys {
		if got[k] != want[k] {
			t.Errorf("account %s: balance %d in the consumer's database, %d committed", k, got[k], want[k])
		}
		sum += got[k]
	}
	applied := b.applied(ctx, t)
	next := map[string]int{}
	for _, a := range applied {
		if _, ok := committed[a.tag]; !ok {
			t.Errorf("posting %s (key %s seq %d) applied but never committed", a.tag, a.key, a.seq)
		}
		if a.seq != next[a.key]+1 {
			t.Errorf("key %s: seq %d applied after seq %d: not in write order (or twice)", a.key, a.seq, next[a.key])
		}
		next[a.key] = a.seq
	}
	for k, n := range wantSeqs {
		if next[k] != n {
			t.Errorf("key %s: %d postings applied, %d committed", k, next[k], n)
		}
	}
	kills, _, started := c.counts()
	t.Logf("inbox chaos: %d committed postings over %d accounts (sum %d), %d relay SIGKILLs, %d relay backends terminated, %d relay processes, drained %s; %d stream entries; consumer killed %d times mid-flight and %d times between commit and XACK (%d consumers); the inbox absorbed %d duplicates (%.2f %% of the postings), %d out of order; %d applied",
		len(committed), keys, sum, kills, terminated, started, drained.Round(time.Millisecond), entries,
		stats.killedMidFlight, stats.killedBeforeAck, stats.consumers, b.dups.Load(), 100*float64(b.dups.Load())/float64(max(len(committed), 1)), b.ooo.Load(), len(applied))
	if b.dups.Load() == 0 {
		t.Error("the inbox absorbed no duplicate: the run proves nothing")
	}
	if stats.killedBeforeAck == 0 {
		t.Error("no consumer was killed between its commit and its XACK")
	}
	if b.ooo.Load() != 0 {
		t.Errorf("%d messages arrived out of order: the writers serialize per key, so none should", b.ooo.Load())
	}
	if kills == 0 {
		t.Error("no relay was killed")
	}
	if exits := c.unexpectedExits(); len(exits) > 0 {
		t.Errorf("unexpected relay exits: %v", exits)
	}
}

// bank is the consumer's database: the inbox tables, the balances and a
// log of the postings applied, in a schema of its own.
type bank struct {
	pool   *pgxpool.Pool
	schema string
	in     *inbox.Inbox
	dups   atomic.Int64
	ooo    atomic.Int64
	failed atomic.Bool
}

func newBank(t *testing.T, pool *pgxpool.Pool, schema string) *bank {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := inbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("inbox migrate: %v", err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	b := &bank{pool: pool, schema: schema}
	if _, err := pool.Exec(ctx, `
CREATE TABLE `+b.table("balances")+` (key text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE `+b.table("applied")+` (n bigserial PRIMARY KEY, key text NOT NULL, seq integer NOT NULL, tag text NOT NULL);`); err != nil {
		t.Fatalf("bank tables: %v", err)
	}
	in, err := inbox.New(inbox.Config{Schema: schema, Hooks: bankHooks{b}})
	if err != nil {
		t.Fatal(err)
	}
	b.in = in
	return b
}

func (b *bank) table(name string) string { return pgx.Identifier{b.schema, name}.Sanitize() }

// post is the consumer's handler: one posting to one account.
func (b *bank) post(ctx context.Context, tx pgx.Tx, x redis.XMessage) error {
	body, _ := x.Values["payload"].(string)
	var p payload
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		return fmt.Errorf("entry %s: payload %q: %w", x.ID, body, err)
	}
	_, err := tx.Exec(ctx, `
WITH b AS (
    INSERT INTO `+b.table("balances")+` AS b (key, balance) VALUES ($1, $2)
    ON CONFLICT (key) DO UPDATE SET balance = b.balance + excluded.balance
)
INSERT INTO `+b.table("applied")+` (key, seq, tag) VALUES ($1, $3, $4)`, p.Key, p.Amount, p.Seq, p.Tag)
	return err
}

func (b *bank) balances(ctx context.Context, t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(ctx, "SELECT key, balance FROM "+b.table("balances"))
	if err != nil {
		t.Fatalf("balances: %v", err)
	}
	out := map[string]int64{}
	var k string
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		t.Fatalf("balances: %v", err)
	}
	return out
}

type posting struct {
	key, tag string
	seq      int
}

func (b *bank) applied(ctx context.Context, t *testing.T) []posting {
	t.Helper()
	rows, err := b.pool.Query(ctx, "SELECT key, tag, seq FROM "+b.table("applied")+" ORDER BY n")
	if err != nil {
		t.Fatalf("applied: %v", err)
	}
	var out []posting
	var p posting
	if _, err := pgx.ForEachRow(rows, []any{&p.key, &p.tag, &p.seq}, func() error { out = append(out, p); return nil }); err != nil {
		t.Fatalf("applied: %v", err)
	}
	return out
}

type bankHooks struct{ b *bank }

func (h bankHooks) Duplicate(inbox.Message)         { h.b.dups.Add(1) }
func (h bankHooks) OutOfOrder(inbox.Message, int64) { h.b.ooo.Add(1) }
func (h bankHooks) Gap(inbox.Message, int64)        {}

// errDied is what a consumer killed between its commit and its XACK sees
// instead of the XACK.
var errDied = errors.New("consumer killed before its XACK")

// dyingClient fails XACK once the consumer is marked dead: its
// transaction has committed, its acknowledgement never leaves.
type dyingClient struct {
	*redis.Client
	dead *atomic.Bool
}

func (d dyingClient) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	if d.dead.Load() {
		cmd := redis.NewIntCmd(ctx)
		cmd.SetErr(errDied)
		return cmd
	}
	return d.Client.XAck(ctx, stream, group, ids...)
}

type consumerStats struct{ consumers, killedMidFlight, killedBeforeAck int }

type consumers struct {
	stop func() consumerStats
}

// consume runs one consumer at a time on the group (one at a time keeps
// each key's order, as a Kafka partition's single owner does) and kills
// each one after a few reads, at a random point of the read after them:
// either in the middle of its transaction (its context ends after a
// random number of postings: the transaction rolls back) or after its
// commit, when its XACK fails. Kills are counted in reads, not in time, so
// that every consumer gets some reads through however slow the machine
// (killed on a timer, consumers on a loaded machine died before finishing
// any read, and the group stopped moving). The next consumer first claims
// what the dead one left pending, then reads on.
func (b *bank) consume(ctx context.Context, t *testing.T, rng *rand.Rand, rdb *redis.Client, stream, group string) consumers {
	var st consumerStats
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for gen := 1; ; gen++ {
			cctx, cancel := context.WithCancel(ctx)
			f := &fate{cancel: cancel, reads: 1 + rng.IntN(3), midFlight: rng.IntN(2) == 0, postings: rng.IntN(60)}
			exited := make(chan error, 1)
			name := fmt.Sprintf("c%d", gen)
			go func() { exited <- b.consumer(cctx, rdb, dyingClient{rdb, &f.dead}, stream, group, name, f) }()
			mu.Lock()
			st.consumers++
			mu.Unlock()
			var err error
			select {
			case <-stop:
				cancel()
				<-exited
				return
			case err = <-exited:
			}
			cancel()
			mu.Lock()
			switch {
			case errors.Is(err, errDied):
				st.killedBeforeAck++
			case errors.Is(err, context.Canceled):
				st.killedMidFlight++
			default:
				t.Errorf("consumer %s: %v", name, err)
				b.failed.Store(true)
				mu.Unlock()
				return
			}
			mu.Unlock()
		}
	}()
	return consumers{stop: func() consumerStats {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return st
	}}
}

// fate is how a consumer dies: after reads whole reads, in the next one,
// either mid-flight (its context ends after postings postings of that
// read's transaction) or after the commit (dead: its XACK fails).
type fate struct {
	cancel    context.CancelFunc
	reads     int
	midFlight bool
	postings  int
	dead      atomic.Bool
}

// consumer claims the group's pending entries, then reads new ones, and
// handles them through the inbox, a read at a time, until ctx ends or an
// XACK fails; f decides when it dies.
func (b *bank) consumer(ctx context.Context, rdb *redis.Client, acker dyingClient, stream, group, name string, f *fate) error {
	g := redisinbox.Group{Client: acker, Stream: stream, Group: group}
	reads := 0
	// One transaction, one inbox statement and one XACK per read.
	handle := func(xs []redis.XMessage) error {
		if len(xs) == 0 {
			return nil
		}
		reads++
		post := b.post
		if reads > f.reads {
			if !f.midFlight {
				f.dead.Store(true)
			} else {
				n := 0
				post = func(ctx context.Context, tx pgx.Tx, x redis.XMessage) error {
					if n++; n > f.postings {
						f.cancel()
						return ctx.Err()
					}
					return b.post(ctx, tx, x)
				}
			}
		}
		if err := redisinbox.HandleBatch(ctx, b.in, b.pool, g, xs, post); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		return nil
	}
	// The reads are never abandoned half way: a read whose context ends
	// while it is on its way may still be carried out by the server, after
	// the next consumer's claim, so that entries land in a dead consumer's
	// pending list unseen while the next one reads on past them (the inbox
	// then reports them out of order, rightly, and the test stalled with a
	// read's worth pending). A kill takes effect between reads, or in the
	// handler's transaction.
	read := context.WithoutCancel(ctx)
	for start := "0-0"; ; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		xs, next, err := rdb.XAutoClaim(read, &redis.XAutoClaimArgs{Stream: stream, Group: group, Consumer: name, Start: start, Count: 200}).Result()
		if err != nil {
			return claimErr(ctx, err)
		}
		if err := handle(xs); err != nil {
			return err
		}
		if next == "0-0" {
			break
		}
		start = next
	}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := rdb.XReadGroup(read, &redis.XReadGroupArgs{Group: group, Consumer: name, Streams: []string{stream, ">"}, Count: 100, Block: 100 * time.Millisecond}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return claimErr(ctx, err)
		}
		for _, s := range res {
			if err := handle(s.Messages); err != nil {
				return err
			}
		}
	}
}

func claimErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
