package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Tests for issue 20, bug 9: recovering from damaged tables.

func (e *env) writeKeys(n int) {
	e.t.Helper()
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, msg("t", fmt.Sprint("k", i), fmt.Sprint(i)))
	}
	e.write(msgs...)
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	require.NoError(e.t, err)
}

// fakeRelay registers a relay that does not run, on a live backend that is
// not a relay's (a connection the test holds, with its real backend_start,
// so that fast failover sees it alive).
func (e *env) fakeRelay(id, heartbeat string) *pgxpool.Conn {
	e.t.Helper()
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(e.t, err)
	e.t.Cleanup(conn.Release)
	_, err = conn.Exec(ctx, `INSERT INTO `+e.table("relays")+` (id, hostname, pid, version, heartbeat_at, backend_pid, backend_start)
SELECT $1, 'nowhere', 1, 'fake', $2::timestamptz, pg_backend_pid(), backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`,
		id, heartbeat)
	require.NoError(e.t, err)
	return conn
}

// Lane rows deleted under a running relay used to stay missing: the
// messages of those lanes were never claimed (197 of 500 stuck) while
// status reported no free lane.
func TestLaneRowsDeletedUnderARunningRelayAreRecreated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r, _ := e.start(e.config(), e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 256 }, "lanes not acquired")
	// The relay renews and claims these rows while they are deleted, so
	// the DELETE may be chosen as a deadlock's victim: an operator would
	// run it again, and so does the test.
	eventually(t, 10*time.Second, func() bool {
		_, err := e.pool.Exec(context.Background(), "DELETE FROM "+e.table("lanes")+" WHERE lane < 100")
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			return false
		}
		require.NoError(t, err)
		return true
	}, "lane rows not deleted")
	e.writeKeys(500)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 15*time.Second), 500), "stuck: %d", e.count("messages"))
	require.Equal(t, 256, e.count("lanes"))
	eventually(t, 5*time.Second, func() bool { return r.OwnedLanes() == 256 }, "recreated lanes not taken")
}

// A created_at of 'infinity' failed every claim of the worker whose lanes
// held the row (cannot scan Infinity into *time.Time): 28 of 50 stuck.
// '-infinity' made status fail (cannot subtract infinite timestamps).
func TestInfiniteCreatedAtIsDeliveredLikeAnyOther(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.writeKeys(50)
	e.exec("UPDATE " + e.table("messages") + " SET created_at = 'infinity' WHERE payload = '7'")
	e.exec("UPDATE " + e.table("messages") + " SET created_at = '-infinity' WHERE payload = '8'")
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 50, st.Pending)
	require.Less(t, st.OldestAge, time.Minute, "an infinite created_at counts as now")

	before := time.Now()
	e.start(e.config(), e.sink)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 15*time.Second), 50), "stuck: %d", e.count("messages"))
	for _, m := range e.sink.Delivered() {
		// The sink sees the claim's database time (same host: same clock,
		// give or take a second).
		require.WithinRange(t, m.CreatedAt, before.Add(-time.Minute), time.Now().Add(time.Minute), "message %s", m.Payload)
	}
}

// A dead letter keeps the infinite created_at of its message; listing it
// used to fail.
func TestDeadLetterWithInfiniteTimesIsListed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.writeKeys(2)
	e.exec("UPDATE " + e.table("messages") + " SET created_at = 'infinity'")
	e.deadLetterAll()
	e.exec("UPDATE " + e.table("dead_letters") + " SET first_failed_at = '-infinity', dead_at = 'infinity' WHERE payload = '1'")
	admin, _ := operator.New(e.pool, e.schema)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	require.True(t, dls[0].CreatedAt.IsZero(), "not a finite time: shown as the zero time")
	require.Nil(t, dls[1].FirstFailedAt)
	require.True(t, dls[1].DeadAt.IsZero())
	_, err = admin.Show(context.Background(), dls[0].ID)
	require.NoError(t, err)
}

// A registered relay that does not run, with heartbeat 'infinity' on a
// live backend (so fast failover cannot tell it is not a relay), counted
// as alive forever: the real relay kept its fair share of 128 lanes and
// the other 128 were never worked (244 of 500 stuck); status failed
// scanning its heartbeat.
func TestFakeRelayWithHeartbeatInTheFutureIsReaped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.fakeRelay("fake-infinity", "infinity")
	e.fakeRelay("fake-future", "2999-01-01")
	// An unrelated live backend's pid with the wrong start time: fast
	// failover reaps this one at the first heartbeat.
	e.exec(`INSERT INTO ` + e.table("relays") + ` (id, hostname, pid, version, heartbeat_at, backend_pid, backend_start)
VALUES ('fake-pid', 'nowhere', 1, 'fake', 'infinity', pg_backend_pid(), '2000-01-01')`)
	admin, _ := operator.New(e.pool, e.schema)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st.Relays, 3)
	for _, x := range st.Relays {
		require.False(t, x.HeartbeatAt.After(st.Now), "a heartbeat in the future shows as now")
	}

	cfg := e.config()
	r, _ := e.start(cfg, e.sink)
	e.writeKeys(500)
	require.NoError(t, e.sink.WaitFor(waitCtx(t, 20*time.Second), 500), "stuck: %d, relay owns %d lanes", e.count("messages"), r.OwnedLanes())
	eventually(t, 5*time.Second, func() bool { return r.OwnedLanes() == 256 }, "fake relays still hold a share")
	require.Equal(t, 1, e.count("relays"))
}

type laneHooks struct {
	relay.NopHooks
	unworked atomic.Int64
}

func (h *laneHooks) UnworkedLanes(n int) { h.unworked.Store(int64(n)) }

// Lanes that no live relay works for longer than a lease TTL are reported
// by the relay (log, UnworkedLanes, hooks) and by status.
func TestLanesNobodyWorksAreReported(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A registered relay that stays alive (its heartbeat kept fresh) but
	// works nothing: a stuck process.
	fake := e.fakeRelay("stuck", "now")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The stuck relay's heartbeat, as a live relay's comes.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			_, _ = fake.Exec(ctx, "UPDATE "+e.table("relays")+" SET heartbeat_at = now() WHERE id = 'stuck'")
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	cfg := e.config()
	hooks := &laneHooks{}
	cfg.Hooks = hooks
	r, _ := e.start(cfg, e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 128 }, "fair share not taken")
	require.Zero(t, r.UnworkedLanes(), "not before a lease TTL")
	eventually(t, 10*time.Second, func() bool { return r.UnworkedLanes() == 128 }, "unworked lanes not reported")
	require.EqualValues(t, 128, hooks.unworked.Load())
	require.NoError(t, r.Ready(context.Background()), "readiness is this relay's own: it works its share")

	admin, _ := operator.New(e.pool, e.schema)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, []operator.LaneStatus{{Route: "", Relays: 2, Worked: 128, Unworked: 128}}, st.Lanes)
	require.Equal(t, 128, st.FreeLanes)

	cancel()
	wg.Wait()
	e.exec("DELETE FROM " + e.table("relays") + " WHERE id = 'stuck'")
	eventually(t, 10*time.Second, func() bool { return r.UnworkedLanes() == 0 && r.OwnedLanes() == 256 }, "lanes not taken back")
	require.Zero(t, hooks.unworked.Load())
}

// Status counts missing lane rows and lanes whose owner is gone as lanes
// nobody works; it used to count only lanes without an unexpired lease
// (196 here instead of 226).
func TestStatusCountsMissingAndOrphanedLanes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.fakeRelay("alive", "now")
	e.exec("DELETE FROM " + e.table("lanes") + " WHERE lane < 10")
	e.exec("UPDATE " + e.table("lanes") + " SET owner = 'alive', lease_until = now() + interval '1 hour' WHERE lane BETWEEN 10 AND 39")
	e.exec("UPDATE " + e.table("lanes") + " SET owner = 'ghost', lease_until = now() + interval '1 hour' WHERE lane BETWEEN 40 AND 59")
	admin, _ := operator.New(e.pool, e.schema)
	st, err := admin.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, 226, st.FreeLanes, "10 missing + 20 of a relay that is gone + 196 free")
	require.Equal(t, []operator.LaneStatus{{Route: "", Relays: 1, Worked: 30, Unworked: 226, Missing: 10}}, st.Lanes)
}

// A relay whose lease heartbeat keeps failing holds no lanes after a
// lease TTL; /readyz used to answer 200 all along.
func TestNotReadyWhileTheLeaseCannotBeRenewed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(sinks.Message) error { return errors.New("unused") })
	r, _ := e.start(e.config(), e.sink)
	eventually(t, 10*time.Second, func() bool { return r.OwnedLanes() == 256 }, "lanes not acquired")
	require.NoError(t, r.Ready(context.Background()))
	e.exec("ALTER TABLE " + e.table("relays") + " RENAME TO relays_away")
	eventually(t, 15*time.Second, func() bool {
		err := r.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "lane lease not renewed")
	}, "still ready with a lease that cannot be renewed")
	e.exec("ALTER TABLE " + e.table("relays_away") + " RENAME TO relays")
	eventually(t, 15*time.Second, func() bool { return r.Ready(context.Background()) == nil }, "not ready again")
}
