package chaos

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestChaosRedis runs real relay processes into a Redis stream (on a
// redis-server of the test's own) and SIGKILLs them at random while
// applications write, and ends their database sessions mid-batch.
// Redis has no server-side deduplication: a relay killed after the
// server added a batch but before its commit adds the batch again. The
// test reads the whole stream (every entry, resends included) and checks that every committed message is
// in it, in per-key order, and that each duplicate carries the id field
// of the message it repeats; it reports how many there are.
func TestChaosRedis(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the Redis chaos test in -short mode: it runs relay processes for about 30 s")
	}
	seed := chaosSeed(t)
	t.Logf("seed %d (CHAOS_SEED reproduces the random choices)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5ED1))
	// The short form runs in make test; CHAOS_LONG=1 writes more, for
	// longer (four times the kills).
	messages, writeFor := int64(8_000), 15*time.Second
	if os.Getenv("CHAOS_LONG") == "1" {
		messages, writeFor = 50_000, 60*time.Second
	}
	const keys, writers, relays = 500, 6, 3

	srv := throwaway.Redis(t)
	ctx, cancel := testContext(t)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	// The relays reach the server through a proxy that holds its answers
	// back: a SIGKILL then often lands between the server adding a batch
	// and the relay's commit, and the batch is added again.
	lag := newLagProxy(t, srv.Addr(), 40*time.Millisecond)

	pool, schema := pgtest.Schema(t)
	wl := newWorkload(t, pgtest.URL(), schema, keys, float64(messages)/0.9/writeFor.Seconds(), seed)
	c := newCluster(t, relayBinary(t), pgtest.URL(), schema, relayArgs("redis://"+lag.addr()+"/0"))
	terminated, drained := killsWhileWriting(ctx, t, rng, pool, c, relays, wl, writers, messages)

	// The workload writes one topic, so one stream holds every entry, in
	// the order the server added them.
	var log []delivery
	for from := "-"; ; {
		entries, err := rdb.XRangeN(ctx, "chaos.orders", from, "+", 5000).Result()
		if err != nil {
			t.Fatalf("XRANGE: %v", err)
		}
		for _, e := range entries {
			id, _ := e.Values["id"].(string)
			key, _ := e.Values["key"].(string)
			body, _ := e.Values["payload"].(string)
			d := delivery{id: id, key: key}
			if err := json.Unmarshal([]byte(body), &d.payload); err != nil {
				t.Fatalf("stream entry %s: payload %q: %v", e.ID, body, err)
			}
			log = append(log, d)
		}
		if len(entries) < 5000 {
			break
		}
		from = "(" + entries[len(entries)-1].ID
	}
	committed := wl.committedMessages(ctx, t)
	v := verify(committed, wl.rolledBackTags(), log)
	kills, _, started := c.counts()
	t.Logf("Redis chaos: %d committed, %d SIGKILLs, %d relay backends terminated, %d relay processes; %d entries in the stream, %d unique, %d duplicates (%.2f %%), each with its message's id field; drained %s after the chaos",
		len(committed), kills, terminated, started, len(log), v.unique, v.duplicates, v.dupPercent(), drained.Round(time.Millisecond))
	for _, s := range v.violations {
		t.Error(s)
	}
	if kills == 0 {
		t.Error("no relay was killed")
	}
	if v.duplicates == 0 {
		t.Error("no message was added twice: the run proves nothing about identifying duplicates")
	}
	if exits := c.unexpectedExits(); len(exits) > 0 {
		t.Errorf("unexpected relay exits: %v", exits)
	}
}
