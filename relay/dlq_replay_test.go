package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// deadLetterAll moves every pending message to the dead-letter table, as
// the relay does with a permanent failure (faster than running one).
func (e *env) deadLetterAll() {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), `WITH d AS (DELETE FROM `+e.table("messages")+` RETURNING *)
INSERT INTO `+e.table("dead_letters")+` (id, message_id, topic, key, payload, headers, created_at, attempts, reason, dedup_key, priority)
SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent', dedup_key, priority FROM d`)
	require.NoError(e.t, err)
}

type written struct {
	outbox.Written
	ID int64
}

func (e *env) insert(m outbox.Message) written {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(e.t, err)
	res, err := e.w.Insert(ctx, tx, m)
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(ctx))
	w := written{Written: res[0]}
	require.NoError(e.t, e.pool.QueryRow(ctx, "SELECT id FROM "+e.table("messages")+" WHERE message_id = $1", w.MessageID).Scan(&w.ID))
	return w
}

func (e *env) dedupKeyOf(id int64) *string {
	e.t.Helper()
	var k *string
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT dedup_key FROM "+e.table("messages")+" WHERE id = $1", id).Scan(&k))
	return k
}

func outcomes(res operator.ReplayResult) map[int64]operator.ReplayOutcome {
	m := map[int64]operator.ReplayOutcome{}
	for _, d := range res.DeadLetters {
		m[d.ID] = d.Outcome
	}
	return m
}

// Issue 20, bug 4: one dead letter whose dedup key was reused made
// `dlq replay --all` fail whole (duplicate key … messages_dedup_key_idx)
// and replay nothing.
func TestReplaySkipsDeadLetterWhoseDedupKeyIsPendingAndReplaysTheRest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	pay1 := e.insert(outbox.Message{Topic: "pay", Key: "1", Payload: []byte("first try"), DedupKey: "pay:1"})
	other1 := e.insert(msg("orders", "a", "x"))
	other2 := e.insert(msg("orders", "b", "y"))
	pay2a := e.insert(outbox.Message{Topic: "pay", Key: "2", Payload: []byte("2a"), DedupKey: "pay:2"})
	e.deadLetterAll()
	// Both pay:2 dead: the key was free after the first died.
	pay2b := e.insert(outbox.Message{Topic: "pay", Key: "2", Payload: []byte("2b"), DedupKey: "pay:2"})
	e.deadLetterAll()
	// The application writes pay:1 again while the first one is dead.
	again := e.insert(outbox.Message{Topic: "pay", Key: "1", Payload: []byte("second try"), DedupKey: "pay:1"})
	require.False(t, again.Duplicate)

	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	want := map[int64]operator.ReplayOutcome{
		pay1.ID: operator.ReplaySkipped, other1.ID: operator.Replayed, other2.ID: operator.Replayed,
		pay2a.ID: operator.Replayed, pay2b.ID: operator.ReplaySkipped,
	}
	dry, err := admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, want, outcomes(dry), "the dry run predicts the outcome")
	require.Equal(t, 5, e.count("dead_letters"), "a dry run changes nothing")

	res, err := admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{})
	require.NoError(t, err, "one conflict must not fail the whole replay")
	require.Equal(t, want, outcomes(res))
	for _, d := range res.DeadLetters {
		switch d.ID {
		case pay1.ID:
			require.Equal(t, operator.CauseDedupKeyPending, d.Cause)
			require.Equal(t, again.MessageID, d.HeldBy)
			require.Contains(t, d.Reason, `dedup key "pay:1" is held by pending message `+again.MessageID)
		case pay2b.ID:
			require.Equal(t, operator.CauseDedupKeyInRun, d.Cause)
			require.Contains(t, d.Reason, `went to dead letter `)
		default:
			require.Empty(t, d.Reason)
		}
	}
	require.Equal(t, 2, e.count("dead_letters"), "the skipped dead letters stay")
	require.Equal(t, 4, e.count("messages"))
	require.Equal(t, "pay:2", *e.dedupKeyOf(pay2a.ID), "the oldest dead letter of a key gets it")

	// Once the pending pay:1 is gone (delivered), the dead one gets its key back.
	_, err = e.pool.Exec(ctx, "DELETE FROM "+e.table("messages")+" WHERE id = $1", again.ID)
	require.NoError(t, err)
	res, err = admin.Replay(ctx, operator.Selection{IDs: []int64{pay1.ID}}, operator.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, map[int64]operator.ReplayOutcome{pay1.ID: operator.Replayed}, outcomes(res))
	require.Equal(t, "pay:1", *e.dedupKeyOf(pay1.ID))

	// The operator knows pay:2's second message is a different operation.
	dry, err = admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{DryRun: true, ClearConflictingDedupKeys: true})
	require.NoError(t, err)
	require.Equal(t, map[int64]operator.ReplayOutcome{pay2b.ID: operator.ReplayedWithoutDedupKey}, outcomes(dry))
	res, err = admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{ClearConflictingDedupKeys: true})
	require.NoError(t, err)
	require.Equal(t, map[int64]operator.ReplayOutcome{pay2b.ID: operator.ReplayedWithoutDedupKey}, outcomes(res))
	require.Equal(t, pay2a.MessageID, res.DeadLetters[0].HeldBy)
	require.Nil(t, e.dedupKeyOf(pay2b.ID))
	require.Zero(t, e.count("dead_letters"))
}

// A dead letter whose message id is pending already (ids reused by hand)
// is skipped with the reason, not replayed a second time.
func TestReplaySkipsDeadLetterWhoseIDIsPending(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := e.insert(msg("t", "k", "x"))
	e.deadLetterAll()
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table("messages")+` (id, topic, payload) VALUES ($1, 't', 'y')`, m.ID)
	require.NoError(t, err)
	admin, _ := operator.New(e.pool, e.schema)
	res, err := admin.Replay(ctx, operator.Selection{IDs: []int64{m.ID}}, operator.ReplayOptions{ClearConflictingDedupKeys: true})
	require.NoError(t, err)
	require.Len(t, res.DeadLetters, 1)
	require.Equal(t, operator.ReplaySkipped, res.DeadLetters[0].Outcome)
	require.Equal(t, operator.CauseIDPending, res.DeadLetters[0].Cause)
	require.Contains(t, res.DeadLetters[0].Reason, "already pending in the outbox")
	require.Equal(t, 1, e.count("dead_letters"))
}

// A writer inserting the dedup key while the replay runs: the replay waits
// for it and then skips the dead letter instead of failing.
func TestReplayWaitsForAWriterOfTheSameDedupKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	dead := e.insert(outbox.Message{Topic: "pay", Key: "1", Payload: []byte("first"), DedupKey: "pay:1"})
	e.insert(msg("orders", "a", "x"))
	e.deadLetterAll()

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	written, err := e.w.Insert(ctx, tx, outbox.Message{Topic: "pay", Key: "1", Payload: []byte("again"), DedupKey: "pay:1"})
	require.NoError(t, err)
	require.False(t, written[0].Duplicate)

	admin, _ := operator.New(e.pool, e.schema)
	type result struct {
		res operator.ReplayResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := admin.Replay(ctx, operator.Selection{All: true}, operator.ReplayOptions{})
		done <- result{res, err}
	}()
	// The replay's insert waits for the writer's transaction.
	eventually(t, 10*time.Second, func() bool {
		var waiting bool
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%dead_letters%')`).Scan(&waiting))
		return waiting
	}, "the replay never waited for the writer")
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	got := outcomes(r.res)
	require.Equal(t, operator.ReplaySkipped, got[dead.ID])
	require.Len(t, r.res.IDs(operator.Replayed), 1, "the unrelated dead letter is replayed")
	for _, d := range r.res.DeadLetters {
		if d.ID == dead.ID {
			require.Equal(t, operator.CauseDedupKeyPending, d.Cause)
			require.Contains(t, d.Reason, "written during the replay")
		}
	}
	require.Equal(t, 1, e.count("dead_letters"))
}
