package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// verdict is what the receiver's log says about the delivery contract.
type verdict struct {
	committed  int // messages committed by the writers
	deliveries int // requests accepted by the receiver
	unique     int // distinct committed messages delivered
	duplicates int // deliveries of an already delivered message
	violations []string
}

func (v verdict) dupPercent() float64 {
	if v.unique == 0 {
		return 0
	}
	return 100 * float64(v.duplicates) / float64(v.unique)
}

// maxReported bounds the violations listed per kind.
const maxReported = 20

// verify checks the receiver's log against the committed messages:
//
//   - every delivered message was committed (a rolled-back or unknown tag
//     is a violation), and its key header, key and seq match what was
//     committed;
//   - one message, one webhook-id: every delivery of a message carries the
//     same id, and no id names two messages (so duplicates are
//     identifiable);
//   - per key, each first delivery is the lowest committed seq not yet
//     delivered (write order, no gaps), and anything else is a re-delivery
//     of a message already delivered: never a jump past an undelivered
//     message;
//   - every committed message was delivered at least once.
func verify(committed map[string]committedMsg, rolledBack map[string]bool, log []delivery) verdict {
	v := verdict{committed: len(committed), deliveries: len(log)}
	kinds := map[string]int{}
	report := func(kind, format string, args ...any) {
		kinds[kind]++
		if kinds[kind] <= maxReported {
			v.violations = append(v.violations, kind+": "+fmt.Sprintf(format, args...))
		}
	}

	// Per key: delivered[seq] and the lowest seq not yet delivered.
	type keyState struct {
		delivered []bool // index seq, 1..n
		next      int
		tags      []string // tag by seq, for messages
	}
	keys := map[string]*keyState{}
	for tag, m := range committed {
		ks := keys[m.key]
		if ks == nil {
			ks = &keyState{next: 1}
			keys[m.key] = ks
		}
		for len(ks.tags) <= m.seq {
			ks.tags = append(ks.tags, "")
			ks.delivered = append(ks.delivered, false)
		}
		ks.tags[m.seq] = tag
	}
	idOf := map[string]string{}  // tag -> webhook-id
	tagOf := map[string]string{} // webhook-id -> tag

	for i, d := range log {
		c, ok := committed[d.Tag]
		if !ok {
			if rolledBack[d.Tag] {
				report("rolled-back message delivered", "delivery #%d: tag %s key %s seq %d webhook-id %s", i, d.Tag, d.key, d.Seq, d.id)
			} else {
				report("uncommitted message delivered", "delivery #%d: tag %s key %s seq %d webhook-id %s", i, d.Tag, d.key, d.Seq, d.id)
			}
			continue
		}
		if d.key != c.key || d.Seq != c.seq {
			report("content mismatch", "delivery #%d: tag %s delivered as key %s seq %d, committed as key %s seq %d", i, d.Tag, d.key, d.Seq, c.key, c.seq)
			continue
		}
		if id, ok := idOf[d.Tag]; ok && id != d.id {
			report("unstable message id", "tag %s delivered with webhook-id %s and %s", d.Tag, id, d.id)
		}
		idOf[d.Tag] = d.id
		if tag, ok := tagOf[d.id]; ok && tag != d.Tag {
			report("message id reused", "webhook-id %s carries tags %s and %s", d.id, tag, d.Tag)
		}
		tagOf[d.id] = d.Tag

		ks := keys[c.key]
		if ks.delivered[c.seq] {
			v.duplicates++
			continue
		}
		if c.seq != ks.next {
			report("per-key order broken", "delivery #%d: key %s seq %d (tag %s) delivered first, before seq %d (tag %s) was ever delivered",
				i, c.key, c.seq, d.Tag, ks.next, ks.tags[ks.next])
		}
		ks.delivered[c.seq] = true
		v.unique++
		for ks.next < len(ks.delivered) && ks.delivered[ks.next] {
			ks.next++
		}
	}
	var lost []string
	for k, ks := range keys {
		for seq := 1; seq < len(ks.delivered); seq++ {
			if !ks.delivered[seq] {
				lost = append(lost, fmt.Sprintf("key %s seq %d (tag %s)", k, seq, ks.tags[seq]))
			}
		}
	}
	slices.Sort(lost)
	for _, l := range lost {
		report("committed message never delivered", "%s", l)
	}
	for kind, n := range kinds {
		if n > maxReported {
			v.violations = append(v.violations, fmt.Sprintf("%s: %d in all (first %d listed)", kind, n, maxReported))
		}
	}
	return v
}

// outboxCounts returns the rows left in the outbox (fan-out copies
// included) and the dead-letter table.
func outboxCounts(ctx context.Context, pool *pgxpool.Pool, schema string) (pending, dead int64, err error) {
	s := migrations.Ident(schema)
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.messages) + (SELECT count(*) FROM `+s+`.deliveries),
    (SELECT count(*) FROM `+s+`.dead_letters)`).Scan(&pending, &dead)
	return pending, dead, err
}

// waitDrained polls until the outbox is empty and returns how long that
// took; it fails the test at the deadline, saying what is left.
func waitDrained(ctx context.Context, t *testing.T, pool *pgxpool.Pool, c *cluster, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var lastErr error
	var pending int64
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var err error
		pending, _, err = outboxCounts(ctx, pool, c.schema)
		if err == nil && pending == 0 {
			return time.Since(start)
		}
		lastErr = err
		sleepCtx(ctx, 100*time.Millisecond)
	}
	msg := fmt.Sprintf("outbox not drained within %s: %d messages pending (last error %v)", timeout, pending, lastErr)
	if st, err := c.status(context.WithoutCancel(ctx)); err == nil {
		var rs []string
		for _, r := range st.Relays {
			rs = append(rs, fmt.Sprintf("%s:%d lanes", r.ID, r.Lanes))
		}
		msg += fmt.Sprintf("; status: pending %d retrying %d oldest %s dead %d free lanes %d relays [%s]",
			st.Pending, st.Retrying, st.OldestAge, st.DeadLetters, st.FreeLanes, strings.Join(rs, " "))
	}
	t.Fatal(msg)
	return 0
}
