package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// batchTotals adds up what Hooks.Batch reports.
type batchTotals struct {
	relay.NopHooks
	mu                                    sync.Mutex
	batches, delivered, dead, uncommitted int
}

func (h *batchTotals) Batch(ev relay.BatchEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches++
	if !ev.Committed {
		h.uncommitted++
		return
	}
	h.delivered += ev.Delivered
	h.dead += ev.DeadLettered
}

func (h *batchTotals) totals() (batches, delivered, dead, uncommitted int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.batches, h.delivered, h.dead, h.uncommitted
}

// The fan-out router settles through the same path as a publishing
// relay: its batches reach Hooks.Batch (so metrics and traces see them),
// and a copy the database refuses is settled row by row, that message
// alone dead-lettered saying why, instead of failing every batch it is in.
func TestRouterSettlesThroughHooksAndApart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// The copies table refuses key "refused" (a trigger raising: a refusal
	// of that row, as an index entry over the size limit would be).
	e.exec(`CREATE FUNCTION ` + e.table("refuse_copy") + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key = 'refused' THEN RAISE EXCEPTION 'copy of % refused', NEW.id; END IF;
    RETURN NEW;
END $$`)
	e.exec(`CREATE TRIGGER refuse_copy BEFORE INSERT ON ` + e.table("deliveries") + ` FOR EACH ROW EXECUTE FUNCTION ` + e.table("refuse_copy") + `()`)

	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, msg("orders.created", fmt.Sprintf("k%d", i%4), fmt.Sprint(i)))
	}
	msgs = append(msgs, msg("orders.created", "refused", "x"), msg("users.created", "u", "no route"))
	e.write(msgs...)

	router, _, _ := e.fanOutConfigs()
	router.Topics = nil // the router also claims users.created, which no destination takes
	hooks := &batchTotals{}
	router.Hooks = hooks
	e.start(router, nil)

	eventually(t, 30*time.Second, func() bool { return e.count("messages") == 0 },
		"%d messages left in the outbox", e.count("messages"))
	require.Equal(t, 80, e.count("deliveries"), "40 messages copied to 2 routes")
	rows, err := e.pool.Query(ctx, `SELECT key, reason, last_error FROM `+e.table("dead_letters")+` ORDER BY key`)
	require.NoError(t, err)
	type dead struct{ key, reason, err string }
	var got []dead
	for rows.Next() {
		var d dead
		require.NoError(t, rows.Scan(&d.key, &d.reason, &d.err))
		got = append(got, d)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 2, "dead letters: %+v", got)
	require.Equal(t, "refused", got[0].key)
	require.Equal(t, relay.ReasonPermanent, got[0].reason)
	require.Contains(t, got[0].err, "cannot be copied to its routes")
	require.Contains(t, got[0].err, "refused")
	require.Equal(t, "u", got[1].key)
	require.Contains(t, got[1].err, `no route matches topic "users.created"`)

	// Hooks.Batch runs once the batch has committed: the last one may be
	// heard a moment after the outbox was seen empty.
	var delivered, deadN int
	eventually(t, 10*time.Second, func() bool {
		_, delivered, deadN, _ = hooks.totals()
		return delivered == 40 && deadN == 2
	}, "Hooks.Batch did not hear of every copied message (40) and dead letter (2)")
}
