package operator_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	admin  *operator.Admin
}

func setup(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	a, err := operator.New(pool, schema)
	require.NoError(t, err)
	return &env{t: t, pool: pool, schema: schema, admin: a}
}

// exec runs sql with {s} standing for the quoted schema.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), replaceSchema(sql, migrations.Ident(e.schema)), args...)
	require.NoError(e.t, err)
}

func replaceSchema(sql, s string) string {
	out := []byte{}
	for i := 0; i < len(sql); i++ {
		if i+3 <= len(sql) && sql[i:i+3] == "{s}" {
			out = append(out, s...)
			i += 2
			continue
		}
		out = append(out, sql[i])
	}
	return string(out)
}

// writeEveryState writes one pending message or copy in each state, and
// dead letters: 7 pending (3 ready, 3 retrying, 1 delayed), 2 dead.
func (e *env) writeEveryState() {
	e.exec(`INSERT INTO {s}.messages (topic, key, payload, available_at, attempts) VALUES
    ('orders', 'a', 'ready', NULL, 0),
    ('orders', 'b', 'failed, waiting', now() + interval '1 hour', 2),
    ('orders', 'c', 'failed, due', now() - interval '1 second', 1),
    ('orders', 'd', 'delayed', now() + interval '1 hour', 0),
    ('orders', 'e', 'delayed, due', now() - interval '1 minute', 0)`)
	e.exec(`INSERT INTO {s}.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, available_at, attempts) VALUES
    ('hook', 1000, gen_random_uuid(), 'orders', 'f', 'copy', '{}', 1, now(), NULL, 0),
    ('hook', 1001, gen_random_uuid(), 'orders', 'g', 'copy, failed', '{}', 2, now(), now() + interval '1 hour', 3)`)
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, route) VALUES
    (2000, gen_random_uuid(), 'orders', 'h', 'dead', '{}', now(), 5, 'max_attempts', ''),
    (2001, gen_random_uuid(), 'orders', 'i', 'dead copy', '{}', now(), 1, 'permanent', 'hook')`)
}

// Status and the metrics count the same states the same way, and every
// pending message is in exactly one of them.
func TestStatusAndMetricsAgree(t *testing.T) {
	e := setup(t)
	e.writeEveryState()
	ctx := context.Background()

	st, err := e.admin.Status(ctx)
	require.NoError(t, err)
	s, err := store.NewSchema(e.schema)
	require.NoError(t, err)
	tot, err := s.Totals(ctx, e.pool)
	require.NoError(t, err)

	require.Equal(t, [5]int64{7, 3, 3, 1, 2}, [5]int64{st.Pending, st.Ready, st.Retrying, st.Delayed, st.DeadLetters}, "status")
	require.Equal(t, [5]int64{st.Pending, st.Ready, st.Retrying, st.Delayed, st.DeadLetters},
		[5]int64{tot.Pending, tot.Ready, tot.Retrying, tot.Delayed, tot.DeadLetters}, "metrics")
	require.Len(t, st.FanOut, 1)
	require.Equal(t, operator.Backlog{Pending: 2, Ready: 1, Retrying: 1, DeadLetters: 1, OldestAge: st.FanOut[0].OldestAge},
		st.FanOut[0].Backlog)

	var misplaced int
	require.NoError(t, e.pool.QueryRow(ctx, replaceSchema(`
SELECT count(*) FROM (SELECT available_at, attempts, held_since FROM {s}.messages UNION ALL SELECT available_at, attempts, held_since FROM {s}.deliveries) m
WHERE `+store.Queued("m")+`::int + `+store.Failed("m")+`::int + `+store.Delayed("m")+`::int + `+store.Parked("m")+`::int <> 1`,
		migrations.Ident(e.schema))).Scan(&misplaced))
	require.Zero(t, misplaced, "rows in none or several of ready, retrying, delayed, parked")

	// A dead letter parked by the hold policy (of the outbox, and of a
	// fan-out copy) is in none of the pending states, and shows as a hold.
	e.exec(`INSERT INTO {s}.messages (id, topic, key, payload, available_at, attempts, held_since, held_route) VALUES
    (2000, 'orders', 'h', 'dead', 'infinity', 5, now() - interval '1 minute', 'orders-route')`)
	e.exec(`INSERT INTO {s}.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, available_at, attempts, held_since) VALUES
    ('hook', 2001, gen_random_uuid(), 'orders', 'i', 'dead copy', '{}', 3, now(), 'infinity', 1, now())`)
	st2, err := e.admin.Status(ctx)
	require.NoError(t, err)
	tot2, err := s.Totals(ctx, e.pool)
	require.NoError(t, err)
	require.Equal(t, [5]int64{st.Pending, st.Ready, st.Retrying, st.Delayed, st.DeadLetters},
		[5]int64{st2.Pending, st2.Ready, st2.Retrying, st2.Delayed, st2.DeadLetters}, "status with parked rows")
	require.Equal(t, [5]int64{tot.Pending, tot.Ready, tot.Retrying, tot.Delayed, tot.DeadLetters},
		[5]int64{tot2.Pending, tot2.Ready, tot2.Retrying, tot2.Delayed, tot2.DeadLetters}, "metrics with parked rows")
	require.Len(t, st2.Held, 2)
	require.Equal(t, "hook", st2.Held[0].Route)
	require.Equal(t, "orders-route", st2.Held[1].Route)
	require.GreaterOrEqual(t, st2.Held[1].OldestAge, time.Minute)
	require.Len(t, st2.Holds, 2)
	require.Equal(t, "h", st2.Holds[0].Key, "the oldest hold first")
	require.EqualValues(t, 2000, st2.Holds[0].ID)
}

// Empty lists are [] in JSON, for a console that iterates them.
func TestStatusJSONEmpty(t *testing.T) {
	e := setup(t)
	st, err := e.admin.Status(context.Background())
	require.NoError(t, err)
	b, err := json.Marshal(st)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	// (lanes is not empty: the migration creates the lanes of route "".)
	for _, k := range []string{"topics", "dead_letters_by_reason", "fan_out", "relays", "route_health"} {
		require.Equal(t, []any{}, m[k], k)
	}
}

// List pages through the dead letters in (id, route) order, a message's
// dead copies included.
func TestListPages(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, payload, headers, created_at, attempts, reason, route)
SELECT i / 2, gen_random_uuid(), 'orders', 'x', '{}', now(), 1, 'permanent', CASE WHEN i % 2 = 0 THEN '' ELSE 'hook' END
FROM generate_series(2, 11) i`)
	ctx := context.Background()
	var got []string
	sel := operator.Selection{Limit: 3}
	for {
		page, err := e.admin.List(ctx, sel)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		require.LessOrEqual(t, len(page), 3)
		for _, d := range page {
			got = append(got, d.Route+":"+string(rune('0'+d.ID)))
		}
		last := page[len(page)-1]
		sel.AfterID, sel.AfterRoute = last.ID, last.Route
	}
	require.Equal(t, []string{":1", "hook:1", ":2", "hook:2", ":3", "hook:3", ":4", "hook:4", ":5", "hook:5"}, got)

	all, err := e.admin.List(ctx, operator.Selection{})
	require.NoError(t, err)
	require.Len(t, all, 10)
	// After (3, "") comes (3, "hook").
	hook, err := e.admin.List(ctx, operator.Selection{Route: "hook", AfterID: 3})
	require.NoError(t, err)
	require.Len(t, hook, 3)
	require.Equal(t, int64(3), hook[0].ID)
}

// The outcomes are the words the replay statements return.
func TestOutcomesMatchTheStore(t *testing.T) {
	require.Equal(t, []string{store.OutcomeReplayed, store.OutcomeReplayedWithout, store.OutcomeSkipped},
		[]string{string(operator.Replayed), string(operator.ReplayedWithoutDedupKey), string(operator.ReplaySkipped)})
}

// Every operator action on a schema that was never migrated says so and
// what to do, instead of a bare "relation does not exist".
func TestActionsBeforeMigrate(t *testing.T) {
	t.Parallel()
	a, err := operator.New(pgtest.Pool(t), pgtest.SchemaName(t))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = a.Status(ctx)
	checkMissing(t, err)
	_, err = a.List(ctx, operator.Selection{All: true})
	checkMissing(t, err)
	_, err = a.Show(ctx, 1)
	checkMissing(t, err)
	_, err = a.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{})
	checkMissing(t, err)
	_, err = a.Purge(ctx, operator.Selection{All: true}, false)
	checkMissing(t, err)
}

func checkMissing(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, outbox.ErrSchemaMissing)
	require.ErrorContains(t, err, "run `outbox-relay migrate`")
}

// Key, Reason and DeadAfter select like the other selectors, in List and
// in the counts of Purge and Replay.
func TestSelectByKeyReasonAndDeadAfter(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, route, dead_at) VALUES
    (1, gen_random_uuid(), 'orders', 'a', 'x', '{}', now(), 5, 'max_attempts', '', now() - interval '2 hours'),
    (2, gen_random_uuid(), 'orders', 'a', 'x', '{}', now(), 1, 'permanent', '', now() - interval '1 minute'),
    (3, gen_random_uuid(), 'orders', NULL, 'x', '{}', now(), 1, 'permanent', '', now()),
    (4, gen_random_uuid(), 'billing', 'b', 'x', '{}', now(), 1, 'permanent', '', now() - interval '3 hours')`)
	ctx := context.Background()
	ids := func(sel operator.Selection) []int64 {
		page, err := e.admin.List(ctx, sel)
		require.NoError(t, err)
		var out []int64
		for _, d := range page {
			out = append(out, d.ID)
		}
		return out
	}
	require.Equal(t, []int64{1, 2}, ids(operator.Selection{Key: "a"}))
	require.Equal(t, []int64{2, 3, 4}, ids(operator.Selection{Reason: "permanent"}))
	hourAgo := time.Now().Add(-time.Hour)
	require.Equal(t, []int64{2, 3}, ids(operator.Selection{DeadAfter: hourAgo}))
	require.Equal(t, []int64{2}, ids(operator.Selection{Key: "a", Reason: "permanent", DeadAfter: hourAgo}))

	require.False(t, operator.Selection{Reason: "permanent"}.Empty())
	n, err := e.admin.Purge(ctx, operator.Selection{Reason: "permanent", DeadAfter: hourAgo}, true)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	plan, err := e.admin.Replay(ctx, operator.Selection{Key: "b"}, operator.ReplayOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []int64{4}, plan.IDs())
}
