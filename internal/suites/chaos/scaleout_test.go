package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// TestScaleOut changes the number of relay processes while messages flow:
// one relay, then four, then two (two leave with SIGTERM). After each step
// `outbox-relay status --json` must show the 256 lanes split evenly among
// exactly the running relays; at the end every committed message must have
// arrived, in per-key order.
func TestScaleOut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the scale-out test in -short mode: it runs relay processes")
	}
	const minMessages = 10_000
	pool, schema := pgtest.Schema(t)
	bin := relayBinary(t)
	ctx, cancel := testContext(t)
	defer cancel()
	wl := newWorkload(t, pgtest.URL(), schema, 500, 1500, uint64(time.Now().UnixNano()))
	rc := newReceiver(t)
	c := newCluster(t, bin, pgtest.URL(), schema, relayArgs(rc.url))

	start := time.Now()
	var steps []string
	step := func(format string, args ...any) {
		steps = append(steps, fmt.Sprintf("%5.1fs %s (committed %d, delivered %d)",
			time.Since(start).Seconds(), fmt.Sprintf(format, args...), wl.committed.Load(), rc.count()))
	}
	var stepsDone atomic.Bool
	var writes sync.WaitGroup
	writes.Go(func() {
		wl.run(ctx, 4, func() bool { return stepsDone.Load() && wl.committed.Load() >= minMessages })
	})
	defer func() {
		cancel() // on an early failure, stop the writers
		writes.Wait()
	}()

	// Each phase lasts until a share of the messages went through it.
	const perPhase = 2000
	flow := func(what string) {
		n := rc.count()
		// 90 s: the writers themselves slow to a few hundred messages
		// a second while the rest of the suite loads the machine.
		waitFor(ctx, t, 90*time.Second, what, func() bool { return rc.count() >= n+perPhase })
	}
	c.start("r1")
	waitLanes(ctx, t, c, map[string]int{"r1.1": 256})
	step("r1 owns every lane")
	flow("deliveries through r1 alone")
	c.start("r2")
	c.start("r3")
	c.start("r4")
	step("r2, r3 and r4 started")
	waitLanes(ctx, t, c, map[string]int{"r1.1": 64, "r2.1": 64, "r3.1": 64, "r4.1": 64})
	step("four relays own 64 lanes each")
	flow("deliveries through four relays")
	var stopTook [2]time.Duration
	var stops sync.WaitGroup
	for i, s := range []string{"r1", "r2"} {
		stops.Go(func() { stopTook[i] = c.stop(s) })
	}
	stops.Wait()
	step("r1 and r2 stopped with SIGTERM in %s and %s", stopTook[0].Round(time.Millisecond), stopTook[1].Round(time.Millisecond))
	waitLanes(ctx, t, c, map[string]int{"r3.1": 128, "r4.1": 128})
	step("r3 and r4 own 128 lanes each")
	flow("deliveries through r3 and r4")
	stepsDone.Store(true)
	writes.Wait()
	step("writes done")

	drained := waitDrained(ctx, t, pool, c, 60*time.Second)
	c.stopAll()
	pending, dead, err := outboxCounts(ctx, pool, schema)
	if err != nil {
		t.Fatalf("outbox counts: %v", err)
	}
	log, bad := rc.snapshot()
	committed := wl.committedMessages(ctx, t)
	v := verify(committed, wl.rolledBackTags(), log)

	t.Logf("steps:\n%s", strings.Join(steps, "\n"))
	t.Logf("%d messages committed, %d rolled back on purpose; %d requests accepted, %d distinct, %d duplicates (%.2f%%); drained %s after the writes",
		len(committed), len(wl.rolledBackTags()), v.deliveries, v.unique, v.duplicates, v.dupPercent(), drained.Round(time.Millisecond))
	c.mu.Lock()
	all := slices.Clone(c.all)
	c.mu.Unlock()
	for _, p := range all {
		n, ok := deliveredBy(p)
		t.Logf("relay %s delivered %d messages", p.id, n)
		if !ok || n == 0 {
			t.Errorf("relay %s delivered nothing (or did not log its stop): every relay should have taken part", p.id)
		}
	}
	if len(committed) < minMessages {
		t.Errorf("only %d messages committed, want at least %d", len(committed), minMessages)
	}
	for _, b := range bad {
		t.Errorf("malformed request at the receiver: %s", b)
	}
	for _, x := range c.unexpectedExits() {
		t.Errorf("relay process: %s", x)
	}
	for _, x := range c.loggedErrors() {
		t.Errorf("relay logged an error: %s", x)
	}
	if pending != 0 || dead != 0 {
		t.Errorf("after the drain: %d messages left in the outbox, %d dead letters; want 0 and 0", pending, dead)
	}
	for _, x := range v.violations {
		t.Error(x)
	}
}

// waitLanes polls `outbox-relay status --json` until exactly the relays in
// want are registered, each owning the given number of lanes, and no lane
// is free.
func waitLanes(ctx context.Context, t *testing.T, c *cluster, want map[string]int) {
	t.Helper()
	const timeout = 20 * time.Second
	start := time.Now()
	deadline := start.Add(timeout)
	var last string
	var seen []string // distinct distributions on the way, for the log
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st, err := c.status(ctx)
		if err != nil {
			last = err.Error()
		} else {
			got := map[string]int{}
			for _, r := range st.Relays {
				got[r.ID] = r.Lanes
			}
			last = fmt.Sprintf("%v free %d", got, st.FreeLanes)
			if len(seen) == 0 || seen[len(seen)-1] != last {
				seen = append(seen, last)
			}
			if maps.Equal(got, want) && st.FreeLanes == 0 {
				t.Logf("lanes %v after %s, via %s", want, time.Since(start).Round(10*time.Millisecond), strings.Join(seen, " → "))
				return
			}
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	t.Fatalf("lanes not rebalanced to %v within %s; last status: %s", want, timeout, last)
}

// waitFor polls cond until it holds or fails the test after timeout.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}
