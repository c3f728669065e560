package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func TestLaneSetPayload(t *testing.T) {
	t.Parallel()
	var s laneSet
	for _, l := range []int{0, 7, 63, 64, 200, 255} {
		s.add(l)
	}
	got, ok := parseLanes(s.payload())
	if !ok || got != s {
		t.Fatalf("payload %q parsed as %v, %v; want %v", s.payload(), got, ok, s)
	}
	for _, bad := range []string{"", "members", "lanes:zz", "lanes:00"} {
		if _, ok := parseLanes(bad); ok {
			t.Errorf("parseLanes(%q) accepted", bad)
		}
	}
}

// TestLaneOfMatchesTheTable: the WAL follower computes a row's lane the
// way the messages table does.
func TestLaneOfMatchesTheTable(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+migrations.Ident(schema)+`.messages (topic, key, payload)
SELECT 't', CASE WHEN g % 7 = 0 THEN NULL ELSE 'key-' || g || 'é' END, '' FROM generate_series(1, 500) g`)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, key, lane FROM `+migrations.Ident(schema)+`.messages`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID   int64
		Key  *string
		Lane int16
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if got := laneOf(r.Key, r.ID); got != int(r.Lane) {
			t.Fatalf("laneOf(%v, %d) = %d, the table says %d", r.Key, r.ID, got, r.Lane)
		}
	}
}
