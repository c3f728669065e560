package chaos

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestChaosNATS runs real relay processes into a JetStream stream (on a
// nats-server of the test's own) and SIGKILLs them at random while
// applications write, and ends their database sessions mid-batch, every
// fault inside the stream's duplicate window.
// A relay killed after the server stored a batch but before its commit
// publishes the batch again: the stream must drop every such resend by
// its Nats-Msg-Id. A core NATS subscriber beside the stream sees every
// publish, resends included, so the test shows both numbers: publishes
// (with the resends) and messages stored (each committed message once:
// 0 duplicates).
func TestChaosNATS(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the NATS chaos test in -short mode: it runs relay processes for about 30 s")
	}
	seed := chaosSeed(t)
	t.Logf("seed %d (CHAOS_SEED reproduces the random choices)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x4A75))
	// The short form runs in make test; CHAOS_LONG=1 writes more.
	messages := int64(8_000)
	if os.Getenv("CHAOS_LONG") == "1" {
		messages = 20_000
	}
	const keys, writers, relays = 500, 6, 3
	const writeFor = 15 * time.Second

	srv := throwaway.NATS(t)
	ctx, cancel := testContext(t)
	defer cancel()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Long enough that a loaded machine's run fits in it: a resend after
	// the window would be stored twice, and the test would not say why.
	const window = 10 * time.Minute
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CHAOS", Subjects: []string{"chaos.>"},
		Storage: jetstream.FileStorage, Duplicates: window})
	if err != nil {
		t.Fatal(err)
	}
	var published atomic.Int64
	sub, err := nc.Subscribe("chaos.>", func(*nats.Msg) { published.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()

	pool, schema := pgtest.Schema(t)
	wl := newWorkload(t, pgtest.URL(), schema, keys, float64(messages)/0.9/writeFor.Seconds(), seed)
	// The relays reach the server through a proxy that holds its answers
	// back: a kill then often lands between the stream storing a batch
	// and the relay's commit, and the batch is sent again. Without it, on
	// a quiet machine that window is a millisecond or two, and some runs
	// saw no resend at all (which proves nothing about the window).
	lag := newLagProxy(t, strings.TrimPrefix(srv.URL(), "nats://"), 20*time.Millisecond)
	c := newCluster(t, relayBinary(t), pgtest.URL(), schema,
		relayArgs("nats://"+lag.addr()+"?stream=CHAOS&reconnect_initial=50ms&reconnect_max=500ms"))
	start := time.Now()
	terminated, drained := killsWhileWriting(ctx, t, rng, pool, c, relays, wl, writers, messages)
	if elapsed := time.Since(start); elapsed > window {
		t.Fatalf("the run took %s, longer than the duplicate window %s: resends may fall outside it", elapsed, window)
	}

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var log []delivery
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		d := delivery{id: m.Header.Get("Nats-Msg-Id"), key: m.Header.Get("outbox-key")}
		if err := json.Unmarshal(m.Data, &d.payload); err != nil {
			t.Fatalf("stream message %d: payload %q: %v", seq, m.Data, err)
		}
		log = append(log, d)
	}
	_ = nc.Flush()
	committed := wl.committedMessages(ctx, t)
	v := verify(committed, wl.rolledBackTags(), log)
	kills, _, started := c.counts()
	t.Logf("NATS chaos: %d committed, %d SIGKILLs, %d relay backends terminated, %d relay processes; %d publishes seen by a core subscriber, %d stored in the stream (%d resends dropped by the server), %d duplicates in the stream; drained %s after the chaos",
		len(committed), kills, terminated, started, published.Load(), len(log), published.Load()-int64(len(log)), v.duplicates, drained.Round(time.Millisecond))
	for _, s := range v.violations {
		t.Error(s)
	}
	if kills == 0 {
		t.Error("no relay was killed")
	}
	if published.Load() <= int64(len(log)) {
		t.Error("no message was published twice: the run proves nothing about the duplicate window")
	}
	if v.duplicates != 0 {
		t.Errorf("%d duplicates in the stream: every resend falls inside the duplicate window and must be dropped", v.duplicates)
	}
	if exits := c.unexpectedExits(); len(exits) > 0 {
		t.Errorf("unexpected relay exits: %v", exits)
	}
}
