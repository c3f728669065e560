package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Relays that disagree on a route never share its lanes unnoticed (issue
// 34): a relay whose configuration of the route (here its sink) differs
// from the live relays' takes none of their lanes unless allowed.

// webhookConfig and stdoutConfig are two configurations of the same
// route that differ only in where the sink delivers.
func (e *env) webhookConfig() relay.Config {
	cfg := e.config()
	cfg.Destination = "https://hooks.example/orders?secret=xxxxx"
	return cfg
}

func (e *env) stdoutConfig() relay.Config {
	cfg := e.config()
	cfg.Destination = "stdout"
	return cfg
}

func (e *env) writeN(n int, prefix string) {
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, msg("orders", fmt.Sprintf("k%d", i%20), fmt.Sprintf("%s%d", prefix, i)))
	}
	e.write(msgs...)
}

// A second relay with another sink on the same route delivers not a
// single message, says why (Ready, the log), and is not even counted
// by the running relay; once the running relay leaves (the end of a
// rolling deploy), it takes the route over.
func TestRelayOfAnotherConfigurationTakesNoLane(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r1, stop1 := e.start(e.webhookConfig(), e.sink)
	eventually(t, 10*time.Second, func() bool { return r1.OwnedLanes() == 256 }, "first relay holds %d lanes", r1.OwnedLanes())

	other := memory.New()
	r2, _ := e.start(e.stdoutConfig(), other)
	var why error
	eventually(t, 10*time.Second, func() bool {
		why = r2.Ready(context.Background())
		return errors.Is(why, relay.ErrConfig)
	}, "the second relay is ready: %v", why)
	require.Contains(t, why.Error(), "sink stdout", "it names its own configuration")
	require.Contains(t, why.Error(), "sink https://hooks.example/orders?secret=xxxxx", "and the running one's")
	require.Contains(t, why.Error(), r1.ID())

	const n = 300
	e.writeN(n, "a")
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), n))
	require.Zero(t, r2.OwnedLanes())
	require.Empty(t, other.Delivered(), "the relay of another configuration delivered nothing")
	require.Equal(t, 256, r1.OwnedLanes(), "the running relay never counted it")
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st.Relays, 1, "a refusing relay does not register")
	require.Equal(t, r1.ConfigSummary(), st.Relays[0].Config)
	require.Empty(t, st.Mixed)

	// The rolling deploy ends: the old relay leaves, the new one takes
	// the route over and delivers what is written next.
	stop1()
	eventually(t, 20*time.Second, func() bool { return r2.OwnedLanes() == 256 }, "the waiting relay holds %d lanes", r2.OwnedLanes())
	require.NoError(t, r2.Ready(context.Background()))
	e.writeN(50, "b")
	require.NoError(t, other.WaitFor(waitCtx(t, 30*time.Second), 50))
	require.Len(t, e.sink.Delivered(), n, "the old sink got only what was written before")
}

// With ConfigChangeFail (the CLI's default), Run returns an error that
// wraps ErrConfig and names both configurations. The two differ only in
// their dead-letter policy (issue 35, finding 11: relays of one route
// with skip and hold shared its keys without a word).
func TestConfigChangeFailStopsRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r1, _ := e.start(e.webhookConfig(), e.sink)
	eventually(t, 10*time.Second, func() bool { return r1.OwnedLanes() == 256 }, "first relay holds %d lanes", r1.OwnedLanes())

	cfg := e.webhookConfig()
	cfg.OnConfigChange = relay.ConfigChangeFail
	cfg.OnDeadLetter = relay.OnDeadLetterHold
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{URL: pgtest.URL(), Workers: cfg.Workers})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	other := memory.New()
	r2, err := relay.New(pool, other, cfg)
	require.NoError(t, err)
	e.writeN(100, "a")
	err = r2.Run(waitCtx(t, 30*time.Second))
	require.ErrorIs(t, err, relay.ErrConfig)
	require.Contains(t, err.Error(), "on-dead-letter hold")
	require.Contains(t, err.Error(), "on-dead-letter skip")
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 30*time.Second), 100))
	require.Empty(t, other.Delivered())
}

// configCount records the last RouteConfigs a relay reported.
type configCount struct {
	relay.NopHooks
	n atomic.Int64
}

func (c *configCount) RouteConfigs(n int) { c.n.Store(int64(n)) }

// With ConfigChangeAllow both configurations deliver, the lanes are
// shared, and every relay of the route, status and the hooks say that two
// configurations coexist. Relays of one configuration report 1.
func TestConfigChangeAllowSharesAndReports(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h1, h2 := &configCount{}, &configCount{}
	cfg1 := e.webhookConfig()
	cfg1.Hooks = h1
	r1, _ := e.start(cfg1, e.sink)
	eventually(t, 10*time.Second, func() bool { return r1.OwnedLanes() == 256 && h1.n.Load() == 1 },
		"first relay holds %d lanes, sees %d configurations", r1.OwnedLanes(), h1.n.Load())

	cfg2 := e.stdoutConfig()
	cfg2.OnConfigChange = relay.ConfigChangeAllow
	cfg2.Hooks = h2
	other := memory.New()
	r2, _ := e.start(cfg2, other)
	eventually(t, 20*time.Second, func() bool { return r1.OwnedLanes() == 128 && r2.OwnedLanes() == 128 },
		"lanes not shared: %d and %d", r1.OwnedLanes(), r2.OwnedLanes())
	eventually(t, 10*time.Second, func() bool { return h1.n.Load() == 2 && h2.n.Load() == 2 && r1.RouteConfigs() == 2 },
		"configurations seen: %d and %d", h1.n.Load(), h2.n.Load())

	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st.Mixed, 1)
	require.Equal(t, "", st.Mixed[0].Route)
	require.Len(t, st.Mixed[0].Configs, 2)
	var summaries []string
	for _, c := range st.Mixed[0].Configs {
		require.Len(t, c.Relays, 1)
		summaries = append(summaries, c.Config)
	}
	require.ElementsMatch(t, []string{r1.ConfigSummary(), r2.ConfigSummary()}, summaries)

	const n = 400
	e.writeN(n, "a")
	eventually(t, 30*time.Second, func() bool { return len(e.sink.Delivered())+len(other.Delivered()) >= n },
		"delivered %d and %d of %d", len(e.sink.Delivered()), len(other.Delivered()), n)
	require.NotEmpty(t, e.sink.Delivered())
	require.NotEmpty(t, other.Delivered())
}

// Two relays of different configurations that start at the same moment
// end with one of them holding every lane and the other none.
func TestSimultaneousStartOfDifferentConfigurationsLeavesOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := memory.New()
	r1, _ := e.start(e.webhookConfig(), e.sink)
	r2, _ := e.start(e.stdoutConfig(), other)
	eventually(t, 20*time.Second, func() bool {
		a, b := r1.OwnedLanes(), r2.OwnedLanes()
		return (a == 256 && b == 0) || (a == 0 && b == 256)
	}, "lanes held: %d and %d", r1.OwnedLanes(), r2.OwnedLanes())
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool {
		st, err := admin.Status(context.Background())
		require.NoError(t, err)
		return len(st.Relays) == 1 && len(st.Mixed) == 0
	}, "the second relay stays registered")
}

// A relay of an older version registers no configuration: it is reported
// as unknown, not refused, and a relay starting beside it takes its share.
func TestRelayOfUnknownConfigurationIsNotRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table("relays")+` (id, hostname, pid, version, backend_pid, started_at)
		VALUES ('old-relay', 'h', 1, 'v0.9', 0, now() - interval '1 hour')`)
	require.NoError(t, err)
	h := &configCount{}
	cfg := e.webhookConfig()
	cfg.Hooks = h
	cfg.LeaseTTL, cfg.Heartbeat = time.Minute, 200*time.Millisecond // the old relay's row stays live
	r, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 128 && h.n.Load() == 1 },
		"the relay holds %d lanes, sees %d configurations", r.OwnedLanes(), h.n.Load())
	require.NoError(t, r.Ready(context.Background()))
}

// A relay that finds, at a heartbeat, a live relay of another
// configuration registered before it (two relays that started at the
// same moment: it came second) hands its lanes back and unregisters in
// that heartbeat's transaction.
func TestRelayYieldsToAnEarlierRelayOfAnotherConfiguration(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.webhookConfig()
	cfg.LeaseTTL, cfg.Heartbeat = time.Minute, 200*time.Millisecond // the row below stays live
	r, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 256 }, "the relay holds %d lanes", r.OwnedLanes())
	_, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table("relays")+`
		(id, hostname, pid, version, backend_pid, started_at, config_hash, config_summary)
		VALUES ('earlier', 'h', 1, 'v', 0, now() - interval '1 hour', '2:0123456789abcdef', 'sink elsewhere')`)
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 0 }, "the relay holds %d lanes", r.OwnedLanes())
	err = r.Ready(context.Background())
	require.ErrorIs(t, err, relay.ErrConfig)
	require.Contains(t, err.Error(), "sink elsewhere")
	require.Empty(t, e.ownedBy(t), "every lane handed back")
	var registered int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table("relays")+` WHERE id = $1`, r.ID()).Scan(&registered))
	require.Zero(t, registered)
}
