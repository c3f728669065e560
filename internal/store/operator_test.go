package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// The rendered statements of the operator, the status and the metrics.
func TestOperatorSQL(t *testing.T) {
	s := testSchema(t)
	for name, sql := range map[string]string{
		"dead_letters_list":        s.listDeadLettersSQL(),
		"dead_letters_of":          s.deadLettersOfSQL(),
		"dead_letters_count":       s.countDeadLettersSQL(),
		"dead_letters_purge":       s.purgeDeadLettersSQL(),
		"dead_letters_replay":      s.replayDeadLettersSQL(),
		"dead_letters_replay_plan": s.planReplaySQL(),
		"archive_count":            s.countArchivedSQL(),
		"archive_replay":           s.replayArchiveSQL(),
		"archive_replay_to_route":  s.replayArchiveToRouteSQL(),
		"status_topics":            s.topicBacklogSQL(),
		"status_routes":            s.routeBacklogSQL(),
		"status_dead_by_reason":    s.deadByReasonSQL(),
		"status_relays":            s.relaysSQL(),
		"status_lanes":             s.laneCoverageSQL(),
		"metrics_totals":           s.totalsSQL(),
		"outbox_empty":             s.emptySQL(),
		"status_held_routes":       s.heldRoutesSQL(),
		"status_holds":             s.holdsSQL(),
		"status_retry_errors":      s.retryErrorsSQL(),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, sql)
		})
	}
}

// RetryErrors groups the retrying rows of the outbox and of the fan-out
// copies by topic, route and last error, counts them, and says when a
// table held more failing rows than it reads. Delivered-never-failed,
// delayed and parked rows are not failing.
func TestRetryErrors(t *testing.T) {
	t.Parallel()
	pool, name := pgtest.Schema(t)
	s, err := NewSchema(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = pool.Exec(ctx, strings.ReplaceAll(`
INSERT INTO $s.messages (id, topic, key, payload, available_at, attempts, last_error, first_failed_at) VALUES
  (1, 'orders', 'a', 'x', now() + interval '1 minute', 3, 'NOT_FOUND - no exchange', now() - interval '10 minutes'),
  (2, 'orders', 'b', 'x', now() + interval '2 minutes', 1, 'NOT_FOUND - no exchange', now() - interval '1 minute'),
  (3, 'orders', 'c', 'x', now() - interval '1 second', 2, 'HTTP 503', now() - interval '5 minutes'),
  (4, 'orders', 'd', 'x', NULL, 0, NULL, NULL),
  (5, 'orders', 'e', 'x', now() + interval '1 hour', 0, NULL, NULL);
INSERT INTO $s.messages (id, topic, key, payload, available_at, attempts, last_error, first_failed_at, held_since, held_route)
  VALUES (6, 'orders', 'f', 'x', 'infinity', 1, 'HTTP 422', now(), now(), 'r');
INSERT INTO $s.deliveries (route, id, message_id, topic, key, payload, headers, lane, created_at, available_at, attempts, last_error, first_failed_at)
  VALUES ('billing', 7, gen_random_uuid(), 'orders', 'g', 'x', '{}', 1, now(), now() + interval '1 minute', 1, 'HTTP 503', now());`, "$s", s.Name()))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.RetryErrors(ctx, pool, 100, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d groups, want 3: %+v", len(got), got)
	}
	e := got[0]
	if e.Topic != "orders" || e.Route != "" || e.Error != "NOT_FOUND - no exchange" || e.Count != 2 || e.Sampled {
		t.Fatalf("first group: %+v", e)
	}
	if d := e.LastSeen.Sub(e.FirstSeen); d < 8*time.Minute || d > 10*time.Minute {
		t.Errorf("first and last seen %s apart, want 9 minutes: %+v", d, e)
	}
	var example int64
	if err := pool.QueryRow(ctx, `SELECT id FROM `+s.Table("messages")+` WHERE message_id::text = $1`, e.ExampleID).Scan(&example); err != nil || example != 1 {
		t.Errorf("example %s is message %d (%v), want the oldest, 1", e.ExampleID, example, err)
	}
	if got[1].Route != "" || got[1].Error != "HTTP 503" || got[2].Route != "billing" || got[2].Error != "HTTP 503" || got[2].Count != 1 {
		t.Errorf("groups: %+v", got)
	}

	// A scan of one row per table reads the row due soonest and says the
	// counts are sampled.
	got, err = s.RetryErrors(ctx, pool, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Error != "HTTP 503" || !got[0].Sampled || !got[1].Sampled {
		t.Fatalf("sampled: %+v", got)
	}
}
