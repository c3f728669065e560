package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestWebhookOutageBesideAnotherRoute is a webhook receiver's afternoon
// off, under a relay with few attempts to spend (--max-attempts 3,
// --retry-initial 1s): the receiver refuses connections for
// outageLength(), then answers 503 to everything for as long, then takes
// messages again, while the steady writer commits to its route and a
// second writer commits to another route of the same relay, into the
// shared RabbitMQ. The relay isolates its routes (isolate-routes): the
// webhook backlog waits among the webhook route's copies, where the
// other route's claims never read.
//
// Nothing is dead-lettered, no message of the webhook route has more
// than 2 attempts counted (the outage breaker counts none), all arrive
// in key order soon after the receiver is back, and the RabbitMQ route's
// commit-to-consumer latency does not follow the webhook route down.
func TestWebhookOutageBesideAnotherRoute(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	var unavailable atomic.Bool
	rc := newReceiver(t, func(*http.Request, []byte) (int, string) {
		if unavailable.Load() {
			return http.StatusServiceUnavailable, "down for maintenance"
		}
		return http.StatusNoContent, ""
	})
	audit := newAuditRoute(t)

	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `max-attempts: 3
retry-initial: 1s
isolate-routes: true
routes:
  - name: hooks
    topics: ["orders"]
    sink: %q
  - name: audit
    topics: ["audit"]
    sink: %q
`, rc.url(), audit.sinkURL), 0o600))
	// The default safety-net poll, as in production (startRelay's 50 ms
	// has every idle worker claim over all its lanes 20 times a second).
	p := startRelay(t, pgtest.URL(), schema, "--config", cfgFile, "--poll-interval", "10s")

	orders := startSteadyWriter(t, pool, schema, nil)
	audit.startWriter(t, pool, schema)
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return len(rc.deliveries()) >= 100 && audit.received() >= 50,
			fmt.Sprintf("steady state: %d webhooks, %d audit messages", len(rc.deliveries()), audit.received())
	})
	steadyAt := time.Now()
	orders.writeMore(t, steadyRate, nil) // about a second of both routes' latency before the outage

	s := migrations.Ident(schema)
	maxAttempts := 0
	// The webhook messages wait as the webhook route's copies once the
	// router has passed them (in the outbox before that).
	sample := func() {
		var a int
		if err := pool.QueryRow(context.Background(),
			`SELECT coalesce(max(attempts), 0) FROM (SELECT attempts FROM `+s+`.messages WHERE topic = 'orders'
			 UNION ALL SELECT attempts FROM `+s+`.deliveries WHERE route = 'hooks') a`).Scan(&a); err == nil {
			maxAttempts = max(maxAttempts, a)
		}
	}
	pending := func() int { return count(t, pool, schema, "messages") + count(t, pool, schema, "deliveries") }
	rc.stop()
	downAt := time.Now()
	orders.writeMore(t, outageWrites(), sample)
	unavailable.Store(true)
	rc.start()
	refusedFor := time.Since(downAt)
	orders.writeMore(t, outageWrites(), sample)
	backlog := pending()
	unavailable.Store(false)
	upAt := time.Now()
	outage := upAt.Sub(downAt)
	delivered := len(rc.deliveries())
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		sample()
		return len(rc.deliveries()) >= delivered+100, "no webhook delivered since the receiver came back"
	})
	written := orders.stop()
	audited := audit.stop()
	var recovered time.Duration
	// A bound for a loaded machine, not a measure: the backlog of a
	// 10-second outage drains in a few seconds; the time is logged.
	eventually(t, max(3*time.Minute, drainBound()), 50*time.Millisecond, func() (bool, string) {
		sample()
		left := pending()
		recovered = time.Since(upAt)
		return left == 0, fmt.Sprintf("%d pending", left)
	})

	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")
	require.LessOrEqual(t, maxAttempts, 2, "attempts counted for a webhook message during the outage")
	got := rc.deliveries()
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	auditGot := audit.deliveries(t, len(audited))
	checkAllDelivered(t, audited, auditGot)
	checkKeyOrder(t, auditGot)

	before, during := audit.p99(steadyAt, downAt), audit.p99(downAt, upAt)
	// The webhook route's backlog is largest at the end of the outage.
	late := audit.p99(upAt.Add(-outage/4), upAt)
	retries, _ := p.metric("outbox_relay_retries_scheduled_total")
	outages, _ := p.metric("outbox_relay_destination_outages_total")
	t.Logf("receiver refused connections for %s, then answered 503 for %s (backlog %d): at most %d attempts counted "+
		"per webhook message, %v retries scheduled, %v outages; %d written, all delivered %s after it came back "+
		"(%d duplicates); audit route p99 %s before the outage, %s during it, %s in its last quarter (%d messages)",
		refusedFor.Round(time.Millisecond), (outage - refusedFor).Round(time.Millisecond), backlog, maxAttempts,
		retries, outages, len(written), recovered.Round(time.Millisecond), dups,
		before.Round(time.Microsecond), during.Round(time.Microsecond), late.Round(time.Microsecond), len(audited))
	// Tens of milliseconds when the routes are independent, and up to
	// half a second on a loaded 2-core machine under -race, before the
	// outage as during it; a route held up by the other's outage would
	// wait for a phase of it. The bound tells the two apart, not a
	// latency target.
	require.Less(t, during, outageLength()/2, "the audit route's p99 during the webhook outage")
}

// auditRoute is the second route of TestWebhookOutageBesideAnotherRoute:
// a writer committing one message at a time to topic "audit" and a
// consumer of its exchange on the shared RabbitMQ, recording each
// message's commit-to-consumer latency.
type auditRoute struct {
	sinkURL string
	queue   string

	mu        sync.Mutex
	committed map[string]time.Time
	arrived   map[string]time.Time
	got       []delivery
	stopped   chan struct{}
	done      chan struct{}
	written   []string
}

func newAuditRoute(t *testing.T) *auditRoute {
	name := testkit.RandName("faults-audit-")
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(name, "direct", false, true, false, false, nil))
	_, err = ch.QueueDeclare(name, false, true, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, "audit", name, false, nil))
	a := &auditRoute{
		sinkURL:   testkit.AMQPURL() + "?" + url.Values{"exchange": {name}}.Encode(),
		queue:     name,
		committed: map[string]time.Time{}, arrived: map[string]time.Time{},
		stopped: make(chan struct{}), done: make(chan struct{}),
	}
	ds, err := ch.Consume(name, "", true, true, false, false, nil)
	require.NoError(t, err)
	go func() {
		for d := range ds {
			now := time.Now()
			a.mu.Lock()
			a.arrived[string(d.Body)] = now
			a.got = append(a.got, delivery{ID: d.MessageId, Payload: string(d.Body)})
			a.mu.Unlock()
		}
	}()
	return a
}

// startWriter commits one message of topic "audit" every 20 ms, over 5
// keys, until stop.
func (a *auditRoute) startWriter(t *testing.T, pool *pgxpool.Pool, schema string) {
	keys := keyNames("a", 5)
	go func() {
		defer close(a.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-a.stopped:
				return
			case <-tick.C:
			}
			ps, err := commitErr(pool, schema, messages("audit", keys, seq, 1, nil))
			if err != nil {
				t.Errorf("audit writer: %v", err)
				return
			}
			now := time.Now()
			a.mu.Lock()
			a.committed[ps[0]] = now
			a.written = append(a.written, ps[0])
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() { a.stop() })
}

// received is how many messages the consumer got so far.
func (a *auditRoute) received() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got)
}

// stop stops the writer and returns the payloads it committed.
func (a *auditRoute) stop() []string {
	select {
	case <-a.stopped:
	default:
		close(a.stopped)
	}
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.written)
}

// deliveries waits until the consumer got n distinct messages and
// returns what it got.
func (a *auditRoute) deliveries(t *testing.T, n int) []delivery {
	t.Helper()
	eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.arrived) >= n, fmt.Sprintf("%d of %d audit messages consumed", len(a.arrived), n)
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// p99 is the 99th percentile of the commit-to-consumer latency of the
// messages committed in [from, to).
func (a *auditRoute) p99(from, to time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ls []time.Duration
	for p, c := range a.committed {
		if c.Before(from) || !c.Before(to) {
			continue
		}
		if r, ok := a.arrived[p]; ok {
			ls = append(ls, r.Sub(c))
		}
	}
	if len(ls) == 0 {
		return 0
	}
	slices.Sort(ls)
	return ls[(len(ls)*99)/100]
}
