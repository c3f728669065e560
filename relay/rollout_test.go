package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Red team, finding 5: a rolling deploy that changes a route must end.
// The relays of the new configuration wait, not ready, while a relay of
// the old one lives; the Kubernetes Deployment controller removes an old
// pod only while more than replicas − maxUnavailable pods are ready. The
// tests below model the controller's rolling update and drive real relays
// with it, under the strategies the repository ships.

// rolloutStrategy is a Deployment's replicas and RollingUpdate, resolved.
type rolloutStrategy struct {
	name                               string
	replicas, maxSurge, maxUnavailable int
}

// resolve turns a RollingUpdate field (an int or "N%") into pods as the
// controller does: a percentage of replicas, rounded up for maxSurge and
// down for maxUnavailable.
func resolve(t *testing.T, v any, replicas int, up bool) int {
	t.Helper()
	switch x := v.(type) {
	case int:
		return x
	case string:
		pct, err := strconv.Atoi(strings.TrimSuffix(x, "%"))
		require.NoError(t, err, "%q", x)
		f := float64(pct*replicas) / 100
		if up {
			return int(math.Ceil(f))
		}
		return int(math.Floor(f))
	}
	t.Fatalf("maxSurge or maxUnavailable %v (%T): want an int or a percentage", v, v)
	return 0
}

// rollingUpdate is a Deployment's strategy as its YAML says it.
type rollingUpdate struct {
	Type          string `yaml:"type"`
	RollingUpdate struct {
		MaxSurge       any `yaml:"maxSurge"`
		MaxUnavailable any `yaml:"maxUnavailable"`
	} `yaml:"rollingUpdate"`
}

func (u rollingUpdate) resolve(t *testing.T, name string, replicas int) rolloutStrategy {
	t.Helper()
	require.Equal(t, "RollingUpdate", u.Type, name)
	s := rolloutStrategy{name: name, replicas: replicas,
		maxSurge:       resolve(t, u.RollingUpdate.MaxSurge, replicas, true),
		maxUnavailable: resolve(t, u.RollingUpdate.MaxUnavailable, replicas, false)}
	if s.maxSurge == 0 && s.maxUnavailable == 0 {
		s.maxUnavailable = 1 // the API server's rule
	}
	return s
}

// shippedStrategies reads the relays' Deployments the repository ships:
// the Helm chart's default values and deploy/kubernetes/deployment.yaml.
func shippedStrategies(t *testing.T) []rolloutStrategy {
	t.Helper()
	var values struct {
		ReplicaCount int           `yaml:"replicaCount"`
		Strategy     rollingUpdate `yaml:"strategy"`
	}
	b, err := os.ReadFile("../deploy/helm/outbox-relay/values.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &values))
	out := []rolloutStrategy{values.Strategy.resolve(t, "helm chart", values.ReplicaCount)}

	b, err = os.ReadFile("../deploy/kubernetes/deployment.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				Replicas int           `yaml:"replicas"`
				Strategy rollingUpdate `yaml:"strategy"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			require.ErrorContains(t, err, "EOF")
			break
		}
		if doc.Kind == "Deployment" && doc.Metadata.Name == "outbox-relay" {
			out = append(out, doc.Spec.Strategy.resolve(t, "deploy/kubernetes", doc.Spec.Replicas))
		}
	}
	require.Len(t, out, 2, "the chart's and deploy/kubernetes' relays")
	return out
}

// deployment is the controller's state of a rollout from an old
// ReplicaSet to a new one: how many pods each wants.
type deployment struct {
	rolloutStrategy
	oldWant, newWant int
}

// sync is one pass of the controller's rolling update
// (pkg/controller/deployment/rolling.go), given the ready pods of each
// ReplicaSet: it scales the new one up within maxSurge, then the old one
// down, its pods that are not ready first, while more than replicas −
// maxUnavailable pods are ready.
func (d *deployment) sync(oldReady, newReady int) {
	if d.newWant < d.replicas {
		if room := d.replicas + d.maxSurge - d.oldWant - d.newWant; room > 0 {
			d.newWant += min(room, d.replicas-d.newWant)
		}
	}
	if d.oldWant == 0 {
		return
	}
	minAvailable := d.replicas - d.maxUnavailable
	maxScaledDown := d.oldWant + d.newWant - minAvailable - (d.newWant - newReady)
	if maxScaledDown <= 0 {
		return
	}
	d.oldWant -= min(d.oldWant-oldReady, maxScaledDown)
	if ready := oldReady + newReady; ready > minAvailable {
		d.oldWant -= min(d.oldWant, ready-minAvailable)
	}
}

func (d *deployment) done(newReady int) bool {
	return d.oldWant == 0 && d.newWant == d.replicas && newReady == d.replicas
}

// model runs a rollout in which an old pod leaves one pass after it is
// removed and a new pod is ready one pass after it is created, unless
// it waits (beside: false) for every old pod to be gone. It returns the
// state it ended in and whether the rollout finished.
func model(s rolloutStrategy, beside bool) (deployment, bool) {
	d := deployment{rolloutStrategy: s, oldWant: s.replicas}
	oldAlive, newPods := s.replicas, 0
	for range 100 {
		newReady := 0
		if beside || oldAlive == 0 {
			newReady = newPods
		}
		if d.done(newReady) {
			return d, true
		}
		oldAlive, newPods = d.oldWant, d.newWant
		d.sync(d.oldWant, newReady)
	}
	return d, false
}

// The strategy the chart shipped (maxUnavailable 1) never ends a rollout
// that changes a route: one old relay stays, ready, and the new ones wait
// for it. The strategies shipped now end it; relays that share the route
// during the change (--on-config-change allow) end it under either.
func TestRolloutModel(t *testing.T) {
	t.Parallel()
	for _, old := range []rolloutStrategy{{"chart before", 2, 1, 1}, {"deploy/kubernetes before", 3, 1, 1}} {
		d, done := model(old, false)
		require.False(t, done, old.name)
		require.Equal(t, old.replicas-old.maxUnavailable, d.oldWant, "%s: the last old relays stay", old.name)
		require.Equal(t, old.replicas+old.maxSurge, d.oldWant+d.newWant, "%s: the new relays fill the surge", old.name)
		_, done = model(old, true)
		require.True(t, done, "%s, with relays that share the route", old.name)
	}
	for _, s := range shippedStrategies(t) {
		_, done := model(s, false)
		require.True(t, done, "%s: %+v", s.name, s)
	}
}

// pod is a relay the simulated controller started; stop is its SIGTERM:
// it drains and returns.
type pod struct {
	r    *relay.Relay
	stop func() error
}

// cluster is the pods of a simulated Deployment under rollout: the old
// configuration's, the new one's, and those terminating; removed are the
// ids of the old pods the controller deleted.
type cluster struct {
	e           *env
	old, new    []*pod
	removed     []string
	oldCfg      relay.Config
	newCfg      relay.Config
	oldSink     *memory.Sink
	newSink     *memory.Sink
	terminating sync.WaitGroup
}

func (c *cluster) start(cfg relay.Config, sink *memory.Sink) *pod {
	r, stop := c.e.startOn(pgtest.URL(), cfg, sink)
	return &pod{r: r, stop: stop}
}

// ready counts the pods whose readiness probe (Ready) passes.
func ready(ps []*pod) int {
	n := 0
	for _, p := range ps {
		if p.r.Ready(context.Background()) == nil {
			n++
		}
	}
	return n
}

// apply creates and deletes pods until each ReplicaSet has what d wants.
// A deleted pod gets SIGTERM (its context ends) and drains meanwhile.
func (c *cluster) apply(d deployment) {
	for len(c.new) < d.newWant {
		c.new = append(c.new, c.start(c.newCfg, c.newSink))
	}
	for len(c.old) > d.oldWant {
		p := c.old[len(c.old)-1]
		c.old = c.old[:len(c.old)-1]
		c.removed = append(c.removed, p.r.ID())
		c.terminating.Add(1)
		go func() {
			defer c.terminating.Done()
			start := time.Now()
			if err := p.stop(); err != nil {
				c.e.t.Errorf("relay %s: %v", p.r.ID(), err)
			}
			// A stop that takes seconds is the first thing to look at
			// when this test is slow (see lease.Leaser.closeConn).
			c.e.t.Logf("old relay %s stopped in %s", p.r.ID(), time.Since(start).Round(time.Millisecond))
		}()
	}
}

// state says, for a failure message, where each pod of c stands: its
// lanes and what its readiness probe answers.
func (c *cluster) state() string {
	var b strings.Builder
	for _, set := range []struct {
		name string
		pods []*pod
	}{{"old", c.old}, {"new", c.new}} {
		for _, p := range set.pods {
			ready := "ready"
			if err := p.r.Ready(context.Background()); err != nil {
				ready = err.Error()
			}
			fmt.Fprintf(&b, "; %s relay %s: %d lanes, %s", set.name, p.r.ID(), p.r.OwnedLanes(), ready)
		}
	}
	fmt.Fprintf(&b, "; delivered: %d by the old configuration, %d by the new", c.oldSink.Len(), c.newSink.Len())
	return b.String()
}

// awaitDelivered waits until every payload of want has been delivered by
// the new configuration (or, with byOld, by the old one: its relays have
// all stopped, so its sink no longer changes). It wakes at the new
// sink's deliveries and waits as long as they go on: a backlog (the
// writer wrote throughout) takes longer to deliver on a loaded machine,
// so the bound is on a stall, no delivery for signalBound, rather than
// on the whole.
func (c *cluster) awaitDelivered(t *testing.T, what string, want []string, byOld bool) {
	t.Helper()
	for {
		got := deliveredPayloads(c.newSink)
		if byOld {
			for p := range deliveredPayloads(c.oldSink) {
				got[p] = true
			}
		}
		var missing []string
		for _, p := range want {
			if !got[p] {
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			return
		}
		// At least as many deliveries as are missing (fewer when
		// some are repeats, hence the loop).
		n := c.newSink.Len()
		ctx, cancel := context.WithTimeout(context.Background(), signalBound)
		err := c.newSink.WaitFor(ctx, n+len(missing))
		cancel()
		if err != nil && c.newSink.Len() == n {
			t.Fatalf("%s: %d of %d messages not delivered (%s the first), and no relay delivered any for %s%s",
				what, len(missing), len(want), missing[0], signalBound, c.state())
		}
	}
}

// deliveredPayloads returns the payloads s delivered.
func deliveredPayloads(s *memory.Sink) map[string]bool {
	got := map[string]bool{}
	for _, m := range s.Delivered() {
		got[string(m.Payload)] = true
	}
	return got
}

// writer commits messages, ten at a time, until stop is called; written
// returns their payloads.
type writer struct {
	e       *env
	cancel  context.CancelFunc
	done    chan error
	mu      sync.Mutex
	written []string
}

func startWriter(e *env) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{e: e, cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- w.run(ctx) }()
	return w
}

func (w *writer) run(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		var msgs []outbox.Message
		var payloads []string
		for j := range 10 {
			p := fmt.Sprintf("m%d", i*10+j)
			msgs = append(msgs, msg("orders", fmt.Sprintf("k%d", (i*10+j)%20), p))
			payloads = append(payloads, p)
		}
		tx, err := w.e.pool.Begin(ctx)
		if err != nil {
			return ignoreCancel(ctx, err)
		}
		if err := w.e.w.Write(ctx, tx, msgs...); err != nil {
			_ = tx.Rollback(context.Background())
			return ignoreCancel(ctx, err)
		}
		// Not cut short by stop: a commit whose outcome is unknown
		// would leave a message out of written, and out of the check.
		if err := tx.Commit(context.Background()); err != nil {
			return err
		}
		w.mu.Lock()
		w.written = append(w.written, payloads...)
		w.mu.Unlock()
	}
}

// ignoreCancel drops the error of a write that stop cut short: that
// transaction did not commit, and its messages were not recorded.
func ignoreCancel(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (w *writer) stop() []string {
	w.cancel()
	require.NoError(w.e.t, <-w.done)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written
}

// newCluster starts the old configuration's relays of a Deployment of s
// (webhookConfig) and waits until they share the route's lanes; the new
// configuration (stdoutConfig) waits for the old one to be gone, as
// every relay does by default.
func newCluster(e *env, s rolloutStrategy) (*cluster, deployment) {
	c := &cluster{e: e, oldCfg: e.webhookConfig(), newCfg: e.stdoutConfig(), oldSink: e.sink, newSink: memory.New()}
	// A test that fails mid-rollout waits for the old pods it removed,
	// which log when they have stopped.
	e.t.Cleanup(c.terminating.Wait)
	require.Equal(e.t, relay.ConfigChangeWait, c.newCfg.WithDefaults().OnConfigChange)
	for range s.replicas {
		c.old = append(c.old, c.start(c.oldCfg, c.oldSink))
	}
	eventually(e.t, 20*time.Second, func() bool {
		held := 0
		for _, p := range c.old {
			if n := p.r.OwnedLanes(); n < 256/len(c.old) {
				return false
			}
			held += p.r.OwnedLanes()
		}
		return held == 256
	}, "the old relays do not share the lanes")
	return c, deployment{rolloutStrategy: s, oldWant: s.replicas}
}

// step is one pass of the controller over the cluster's pods.
func (c *cluster) step(d *deployment) (newReady int) {
	oldReady, newReady := ready(c.old), ready(c.new)
	d.sync(oldReady, newReady)
	c.apply(*d)
	return newReady
}

// Under each strategy the repository ships, a rollout that changes the
// route (its sink) ends, driven by the Deployment controller's rule, while
// messages are written throughout: every message written is delivered,
// by the old configuration or the new, and once the rollout has ended
// only the new one delivers.
func TestRollingChangeOfARouteFinishes(t *testing.T) {
	t.Parallel()
	for _, s := range shippedStrategies(t) {
		t.Run(s.name, func(t *testing.T) {
			e := setup(t)
			c, d := newCluster(e, s)
			// The old relays have work in flight when the rollout begins:
			// their drain, and the handover of the lanes they were
			// claiming from, are part of it.
			c.oldSink.SetDelay(20 * time.Millisecond)
			w := startWriter(e)
			if err := c.oldSink.WaitFor(waitCtx(t, 30*time.Second), 50); err != nil {
				t.Fatalf("before the rollout: %v%s", err, c.state())
			}
			// Each poll is a pass of the controller.
			if !testkit.Poll(waitCtx(t, 60*time.Second), 10*time.Millisecond, func() bool { return d.done(c.step(&d)) }) {
				t.Fatalf("the rollout did not end: %+v%s", d, c.state())
			}
			c.terminating.Wait()
			written := w.stop()
			require.NotEmpty(t, written)
			// At least once: a message may come twice (a lease that
			// expired on a loaded machine), never not at all.
			c.awaitDelivered(t, "written before and during the rollout", written, true)
			t.Logf("%s: %d messages written before and during the rollout, %d delivered by the old configuration, %d by the new",
				s.name, len(written), c.oldSink.Len(), c.newSink.Len())
			// The old relays left as a drain leaves: unregistered, their
			// lanes handed back. One still registered is one the relays
			// of the new configuration would wait for.
			var left []string
			rows, err := e.pool.Query(context.Background(), "SELECT id FROM "+e.table("relays")+" WHERE id = ANY($1) UNION SELECT owner FROM "+e.table("lanes")+" WHERE owner = ANY($1)", c.removed)
			require.NoError(t, err)
			for rows.Next() {
				var id string
				require.NoError(t, rows.Scan(&id))
				left = append(left, id)
			}
			require.NoError(t, rows.Err())
			require.Empty(t, left, "old relays still registered or holding lanes after they stopped")
			for _, p := range c.new {
				if !testkit.Poll(waitCtx(t, signalBound), 10*time.Millisecond, func() bool { return p.r.OwnedLanes() > 0 }) {
					t.Fatalf("relay %s holds no lane%s", p.r.ID(), c.state())
				}
			}
			before := c.oldSink.Len()
			e.writeN(50, "after")
			var after []string
			for i := range 50 {
				after = append(after, fmt.Sprintf("after%d", i))
			}
			// Waited for by payload: a count taken once they are
			// written may already include some of them.
			c.awaitDelivered(t, "written after the rollout", after, false)
			require.Equal(t, before, c.oldSink.Len(), "the old configuration delivered after the rollout")
		})
	}
}

// Under the strategy the chart shipped before (maxUnavailable 1), the
// same rollout stalls with real relays, as the model says: the last old
// relay stays ready and delivering, the new relays take no lane and
// answer Ready with the reason, naming the old configuration, heartbeat
// after heartbeat, and the controller may remove nothing more.
func TestRollingChangeOfARouteStallsUnderMaxUnavailableOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, d := newCluster(e, rolloutStrategy{"chart before", 2, 1, 1})
	eventually(t, 30*time.Second, func() bool {
		c.step(&d)
		return d.oldWant == 1 && len(c.new) == 2
	}, "the rollout did not reach its stall")
	for _, p := range c.new {
		mark := p.r.SignalCount(relay.SigLeaseHeld)
		p.r.AwaitSignal(t, signalBound, relay.SigLeaseHeld, mark+3, nil)
		err := p.r.Ready(context.Background())
		require.ErrorIs(t, err, relay.ErrConfig)
		require.Contains(t, err.Error(), "waits until they are gone")
		require.Contains(t, err.Error(), "sink https://hooks.example/orders?secret=xxxxx", "it names the old configuration")
		require.Zero(t, p.r.OwnedLanes())
	}
	before := d
	require.Zero(t, c.step(&d), "no new relay is ready")
	require.Equal(t, before, d, "the controller removes nothing more")
	eventually(t, 20*time.Second, func() bool { return c.old[0].r.OwnedLanes() == 256 },
		"the last old relay holds %d lanes", c.old[0].r.OwnedLanes())
	e.writeN(50, "stalled")
	require.NoError(t, c.oldSink.WaitFor(waitCtx(t, 30*time.Second), 50))
	require.Empty(t, c.newSink.Delivered())
}
