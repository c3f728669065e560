package relayprom_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Issue 20, bug 9: a created_at of ±infinity (written by hand) made every
// backlog check fail (cannot subtract infinite timestamps), freezing the
// lag gauges.
func TestBacklogGaugesSurviveInfiniteCreatedAt(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, payload, created_at)
VALUES ('t', 'a', '-infinity'), ('t', 'b', 'infinity'), ('t', 'c', now() - interval '10 seconds')`)
	require.NoError(t, err)
	reg := watchOutbox(t, pool, schema)
	eventually(t, func() bool { return value(t, reg, "outbox_relay_pending_messages", nil) == 3 }, "pending gauge never set")
	require.Zero(t, value(t, reg, "outbox_relay_outbox_check_errors_total", nil))
	// The oldest by id has created_at -infinity: it counts as now.
	require.Less(t, value(t, reg, "outbox_relay_oldest_pending_age_seconds", nil), 5.0)
	require.Zero(t, value(t, reg, "outbox_relay_unworked_lanes", map[string]string{"route": ""}))
}
