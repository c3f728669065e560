package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Issue 20, bug 4: `dlq replay --all` with one dead letter whose dedup key
// a pending message holds exited 1 and replayed nothing.
func TestDLQReplayReportsEachDeadLetter(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters
		(id, message_id, topic, key, payload, headers, created_at, attempts, reason, dedup_key)
		VALUES (11, gen_random_uuid(), 'pay', '1', 'x', '{}', now(), 1, 'permanent', 'pay:1'),
		       (12, gen_random_uuid(), 'orders', 'a', 'x', '{}', now(), 1, 'permanent', NULL),
		       (13, gen_random_uuid(), 'orders', 'b', 'x', '{}', now(), 1, 'permanent', NULL)`)
	require.NoError(t, err)
	var pending string
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+s+`.enqueue('pay', '1', 'again'::text, dedup_key => 'pay:1')::text`).Scan(&pending))

	code, out, stderr := run(t, "dlq", "replay", "--all", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would replay 2 dead letters: 12 13")
	require.Contains(t, out, "would skip 1 dead letters")

	code, out, stderr = run(t, "dlq", "replay", "--all")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "replayed 2 dead letters: 12 13")
	require.Contains(t, out, "skipped 1 dead letters (left in the table)")
	require.Contains(t, out, fmt.Sprintf(`dedup key "pay:1" is held by pending message %s`, pending))

	code, out, stderr = run(t, "dlq", "replay", "--all", "--clear-conflicting-dedup-keys", "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		DeadLetters []struct {
			ID      int64  `json:"id"`
			Outcome string `json:"outcome"`
			HeldBy  string `json:"held_by"`
		} `json:"dead_letters"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.DeadLetters, 1)
	require.Equal(t, int64(11), res.DeadLetters[0].ID)
	require.Equal(t, "replayed_without_dedup_key", res.DeadLetters[0].Outcome)
	require.Equal(t, pending, res.DeadLetters[0].HeldBy)

	code, out, _ = run(t, "dlq", "replay", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "--clear-conflicting-dedup-keys")
	require.Contains(t, out, "the dead letter is skipped")
}

// The dlq commands select by key, reason and dead time, as the console's
// API does.
func TestDLQSelectByKeyReasonAndTime(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	s := migrations.Ident(schema)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+s+`.dead_letters
		(id, message_id, topic, key, payload, headers, created_at, attempts, reason, dead_at)
		VALUES (1, gen_random_uuid(), 'orders', 'a', 'x', '{}', now(), 5, 'max_attempts', '2026-01-01T00:00:00Z'),
		       (2, gen_random_uuid(), 'orders', 'a', 'x', '{}', now(), 1, 'permanent', '2026-02-01T00:00:00Z'),
		       (3, gen_random_uuid(), 'orders', 'b', 'x', '{}', now(), 1, 'permanent', '2026-03-01T00:00:00Z')`)
	require.NoError(t, err)
	code, out, stderr := run(t, "dlq", "purge", "--key", "a", "--reason", "permanent", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "1 dead letter")
	code, out, stderr = run(t, "dlq", "replay", "--dead-after", "2026-01-15T00:00:00Z", "--dead-before", "2026-02-15T00:00:00Z")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 1 dead letters: 2")
	code, _, stderr = run(t, "dlq", "purge", "--dead-after", "yesterday")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "dead-after: want an RFC 3339 time")
	// An unknown reason could only select nothing: refused, naming the
	// reasons there are.
	code, _, stderr = run(t, "dlq", "purge", "--reason", "bogus")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown dead-letter reason "bogus": the reasons are max_attempts, permanent`)
	code, _, stderr = run(t, "dlq", "list", "--reason", "bogus")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "the reasons are")
	// --route "" names the default route (the outbox's own dead letters).
	_, err = pool.Exec(context.Background(), `INSERT INTO `+s+`.dead_letters
		(id, message_id, topic, key, payload, headers, created_at, attempts, reason, route, dead_at)
		VALUES (3, gen_random_uuid(), 'orders', 'b', 'x', '{}', now(), 1, 'permanent', 'hook', '2026-03-01T00:00:00Z')`)
	require.NoError(t, err)
	code, out, stderr = run(t, "dlq", "purge", "--route", "", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "2 dead letter")
}
