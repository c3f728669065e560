package relay_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// legacyRow inserts a row the way a writer could before the length limits
// of migration 8 existed (the limits only apply to new rows, so such rows
// can still be in an upgraded outbox).
func (e *env) legacyRow(topic, key, payload string) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(e.t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	for _, c := range []string{"messages_topic_length", "messages_key_length"} {
		_, err := tx.Exec(ctx, "ALTER TABLE "+e.table("messages")+" DROP CONSTRAINT IF EXISTS "+c)
		require.NoError(e.t, err)
	}
	_, err = tx.Exec(ctx, "INSERT INTO "+e.table("messages")+" (topic, key, payload) VALUES ($1, $2, $3)", topic, key, []byte(payload))
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(ctx))
}

// incompressible returns n bytes that Postgres cannot compress below the
// size of an index entry.
func incompressible(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		sum := md5.Sum([]byte(strconv.Itoa(i)))
		b.WriteString(hex.EncodeToString(sum[:]))
	}
	return b.String()[:n]
}

// timesDelivered counts deliveries per payload.
func timesDelivered(ms []sinks.Message) map[string]int {
	n := map[string]int{}
	for _, m := range ms {
		n[string(m.Payload)]++
	}
	return n
}

// A row the database cannot settle (its dead letter or its retry needs an
// index entry over Postgres' size limit) once failed the whole batch's
// settle every cycle, so the batch's good messages were published again and
// again and nothing left the outbox. Now the row is settled apart from the
// rest: the good messages are delivered once, the bad row ends as a dead
// letter with its full content.
func TestUnstorableRowDoesNotStallItsBatch(t *testing.T) {
	t.Parallel()
	longTopic := incompressible(3200) // Postgres' limit for an index entry is 2,704 bytes
	longKey := incompressible(4000)
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error {
		switch {
		case m.Topic == longTopic:
			return sinks.Permanent(errors.New("topic name is invalid")) // what Kafka says
		case m.Key == longKey:
			return errors.New("503 service unavailable") // a retry, whose index entry cannot be stored
		}
		return nil
	})
	e.legacyRow(longTopic, "k", "long topic")
	e.legacyRow("t1", longKey, "long key")
	for _, p := range []string{"g1", "g2", "g3"} {
		e.write(msg("t1", "g", p))
	}
	cfg := e.config()
	cfg.Workers = 1 // every row in one batch
	e.start(cfg, e.sink)

	eventually(t, 20*time.Second, func() bool { return e.count("messages") == 0 },
		"the outbox never emptied: the batch's settle keeps failing")
	require.Equal(t, 2, e.count("dead_letters"))
	n := timesDelivered(e.sink.Delivered())
	for _, p := range []string{"g1", "g2", "g3"} {
		require.Equal(t, 1, n[p], "message %s delivered %d times", p, n[p])
	}

	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	byPayload := map[string]operator.DeadLetter{}
	for _, d := range dls {
		byPayload[string(d.Payload)] = d
	}
	require.Equal(t, longTopic, byPayload["long topic"].Topic, "the dead letter keeps the full topic")
	require.Equal(t, relay.ReasonPermanent, byPayload["long topic"].Reason)
	lk := byPayload["long key"]
	require.Equal(t, longKey, *lk.Key, "the dead letter keeps the full key")
	require.Equal(t, relay.ReasonPermanent, lk.Reason)
	require.Contains(t, *lk.LastError, "cannot schedule a retry")
	require.Contains(t, *lk.LastError, "503 service unavailable")
}

// A row the database refuses even as a dead letter (here a trigger of the
// operator's) is parked, not lost and not re-sent at every cycle: its next
// attempt waits the longest retry delay, and the rest of its batch settles.
func TestRowThatCannotBeDeadLetteredIsParked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `
CREATE FUNCTION `+migrations.Ident(e.schema)+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload = 'cursed'::bytea THEN RAISE EXCEPTION 'no dead letters of this one'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE INSERT ON `+e.table("dead_letters")+` FOR EACH ROW EXECUTE FUNCTION `+migrations.Ident(e.schema)+`.refuse()`)
	require.NoError(t, err)
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "cursed" {
			return sinks.Permanent(errors.New("rejected"))
		}
		return nil
	})
	e.write(msg("t", "a", "cursed"), msg("t", "b", "fine1"), msg("t", "c", "fine2"))
	cfg := e.config()
	cfg.Workers = 1
	cfg.RetryMax = time.Hour
	e.start(cfg, e.sink)

	eventually(t, 20*time.Second, func() bool { return e.count("messages") == 1 }, "the good messages never left the outbox")
	var attempts int
	var lastErr string
	var waits time.Duration
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT attempts, last_error, available_at - now() FROM `+e.table("messages")).
		Scan(&attempts, &lastErr, &waits))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "cannot be dead-lettered")
	require.Contains(t, lastErr, "no dead letters of this one")
	require.Greater(t, waits, 50*time.Minute, "parked for the longest retry delay")
	n := timesDelivered(e.sink.Delivered())
	require.Equal(t, 1, n["fine1"])
	require.Equal(t, 1, n["fine2"])
	require.Equal(t, 0, e.count("dead_letters"))
}
