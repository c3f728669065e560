package faults

import (
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
)

// outageLength is how long the sink stays down: 5s by default, 60s with
// FAULTS_LONG=1, or FAULTS_OUTAGE (a Go duration: FAULTS_OUTAGE=10m for
// an afternoon's outage in ten minutes).
//
// The outage tests measure it in the applications' writes, outageWrites,
// not in wall-clock time.
func outageLength() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("FAULTS_OUTAGE")); err == nil && d > 0 {
		return d
	}
	if long() {
		return 60 * time.Second
	}
	return 5 * time.Second
}

// drainBound bounds the drain after an outage: a minute, and the
// outage's length twice over (the backlog of a 10-minute outage at the
// writer's pace drains in minutes, not seconds).
func drainBound() time.Duration { return time.Minute + 2*outageLength() }

// runBound bounds a whole outage test.
func runBound() time.Duration { return 5*time.Minute + 4*outageLength() }

// outageWrites is how many messages the steady writer commits while a
// sink is down: about outageLength() at the writer's pace.
func outageWrites() int { return int(outageLength().Seconds() * steadyRate) }

// outageConfig is the relay configuration of the outage tests: fast
// backoff so the test is short, and attempts high enough that an outage
// never dead-letters anything.
var outageConfig = relay.Config{
	Workers: 2, BatchSize: 200, MaxAttempts: 1000,
	RetryInitial: 250 * time.Millisecond, RetryMultiplier: 2, RetryMax: 2 * time.Second, RetryJitter: 0.2,
}

// minDelay is the shortest delay the backoff can pick after the failures-th
// failure (jitter at its low end).
func minDelay(cfg relay.Config, failures int) time.Duration {
	d := float64(cfg.RetryInitial)
	for i := 1; i < failures; i++ {
		d *= cfg.RetryMultiplier
		if d > float64(cfg.RetryMax) {
			d = float64(cfg.RetryMax)
			break
		}
	}
	return time.Duration(d * (1 - cfg.RetryJitter))
}

// maxFailures bounds how many times one message can fail during an outage
// of length d: consecutive attempts are at least minDelay apart (less a
// small allowance for the time the failing Send itself took), so the
// failures fit in d only so many times.
func maxFailures(cfg relay.Config, d, perGap time.Duration) int {
	n, spent := 1, time.Duration(0)
	for {
		spent += minDelay(cfg, n) - perGap
		if spent > d {
			return n
		}
		n++
	}
}

// outageRig is one sink with a way to break it and a way to see what its
// consumers received.
type outageRig struct {
	sink       sinks.Sink
	down, up   func()
	deliveries func() []delivery
	// breaks: the outage opens the route's breaker (the sink reports the
	// destination down), so no message counts an attempt and none is
	// retried in its row; otherwise every failure counts one, spaced by
	// the backoff.
	breaks bool
}

// runOutage relays a steady stream of writes through rig, takes the sink
// down for outageLength() in the middle and checks the outcome.
func runOutage(t *testing.T, pool *pgxpool.Pool, schema string, rig outageRig) {
	cfg := outageConfig
	cs := newCountingSink(rig.sink)
	p := runInproc(t, pgtest.URL(), schema, cs, cfg)

	w := startSteadyWriter(t, pool, schema, map[string]string{"type": "OrderPlaced"})

	// Steady state first.
	eventually(t, 20*time.Second, 20*time.Millisecond, func() (bool, string) {
		return len(rig.deliveries()) >= 100, "waiting for the first deliveries"
	})
	pendingAtDown := count(t, pool, schema, "messages")
	rig.down()
	downAt := time.Now()
	maxPending := pendingAtDown
	sample := func() { maxPending = max(maxPending, count(t, pool, schema, "messages")) }
	// The requests on the wire when the sink went away count an attempt
	// (those of a batch that partly got through: the sink's answer says
	// nothing about the destination as a whole); nothing after them may.
	// They are over once the applications have written for a while.
	const onTheWire = 2 * time.Second
	w.writeMore(t, int(onTheWire.Seconds()*steadyRate), sample)
	attemptedEarly := attempted(t, pool, schema)
	w.writeMore(t, outageWrites()-int(onTheWire.Seconds()*steadyRate), sample)
	attemptedLate := attempted(t, pool, schema)
	deliveredDuringOutage := len(rig.deliveries())
	rig.up()
	upAt := time.Now()
	outage := upAt.Sub(downAt)
	// The sink delivers again before the writer stops.
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		return len(rig.deliveries()) >= deliveredDuringOutage+100, "no delivery since the sink came back"
	})
	written := w.stop()

	var recoveredAt time.Time
	eventually(t, 60*time.Second+outage, 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		if left == 0 && distinct(rig.deliveries()) >= len(written) {
			recoveredAt = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("%d pending, %d of %d delivered", left, distinct(rig.deliveries()), len(written))
	})
	got := rig.deliveries()
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")
	require.Greater(t, maxPending, pendingAtDown+100, "the backlog grows while the sink is down")

	// Attempts per message: bounded by the backoff, and spaced by it.
	// Failures can only happen while the sink is down, give or take a
	// request in flight when it came back.
	const perGap = 30 * time.Millisecond
	bound := maxFailures(cfg, outage+time.Second, perGap) + 1
	tries := cs.attempts()
	hist := map[int]int{}
	worst, failedMsgs := 0, 0
	for id, ts := range tries {
		hist[len(ts)]++
		worst = max(worst, len(ts))
		if len(ts) > 1 {
			failedMsgs++
		}
		require.LessOrEqual(t, len(ts), bound, "message %s attempted %d times in a %s outage", id, len(ts), outage)
		if rig.breaks {
			// Its Sends are not attempts: a batch the breaker rolls back
			// untouched is claimed again at once, or by the next probe,
			// with no backoff to wait (Stats().Retried is checked below).
			continue
		}
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			require.GreaterOrEqual(t, gap, minDelay(cfg, i)-perGap,
				"message %s: attempt %d came %s after attempt %d; backoff minimum is %s", id, i+1, gap, i, minDelay(cfg, i))
		}
	}
	st := p.r.Stats()
	if rig.breaks {
		// No attempt counted later in the outage. The drain may count a
		// few: a Send that outlives --publish-timeout (30 s) fails the
		// request on the wire, an attempt; at a load average of 17, with
		// the receiver in this race-instrumented process, 5 of 240,300
		// messages of a 10-minute outage's drain did. At most one in a
		// thousand; a failure prints the relay's breaker and retry lines.
		inDrain, drainAllowed := st.Retried-int64(attemptedLate), int64(len(written)/1000)
		if attemptedEarly != attemptedLate || inDrain > drainAllowed {
			// The relay's log is read only for a failure's message.
			lines := fmt.Sprintf("the sink down from %s to %s; the relay's lines about the destination and its retries:\n%s\n%s",
				downAt.Format("15:04:05.000"), upAt.Format("15:04:05.000"),
				p.logs.matching("destination", 20), p.logs.matching("retry scheduled", 20))
			require.Equal(t, attemptedEarly, attemptedLate, "attempts counted after the breaker opened; %s", lines)
			require.LessOrEqual(t, inDrain, drainAllowed,
				"retries in the drain, beyond the requests on the wire when the sink went away; %s", lines)
		}
	} else {
		require.Positive(t, failedMsgs, "no message was retried: the outage was not seen")
	}
	var dist []string
	var ks []int
	for k := range hist {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	for _, k := range ks {
		dist = append(dist, fmt.Sprintf("%d:%d", k, hist[k]))
	}
	t.Logf("outage %s: backlog %d -> max %d; %d delivered during the outage (before it bit); "+
		"rows with an attempt counted %d after the first %s, %d at its end; "+
		"%d written, all delivered %s after the sink came back (%d duplicates); "+
		"%d messages retried, worst %d attempts (bound %d from the backoff), attempts:messages %v; relay retried %d, dead-lettered %d",
		outage, pendingAtDown, maxPending, deliveredDuringOutage, attemptedEarly, onTheWire, attemptedLate, len(written), recoveredAt.Sub(upAt).Round(time.Millisecond), dups,
		failedMsgs, worst, bound, dist, st.Retried, st.DeadLettered)
}

// TestSinkOutageHTTP takes the webhook receiver down (its listener closed:
// connections refused) and brings it back on the same port.
func TestSinkOutageHTTP(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	rc := newReceiver(t, nil)
	sink, err := httpsink.New(httpsink.Config{URL: rc.url()}, nil)
	require.NoError(t, err)
	runOutage(t, pool, schema, outageRig{sink: sink, down: rc.stop, up: rc.start, deliveries: rc.deliveries, breaks: true})
}

// TestSinkOutageKafka keeps the broker up but makes it answer every produce
// request with NOT_ENOUGH_REPLICAS (retriable), through kfake's ControlKey.
// The sink reports that code as the destination unavailable, and across
// the keys of a batch it opens the breaker: no attempt is counted.
func TestSinkOutageKafka(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	k := newKafkaRig(t, []string{"orders"})
	runOutage(t, pool, schema, outageRig{
		sink:       k.sink(t, nil),
		down:       func() { k.failOn.Store(int32(kerr.NotEnoughReplicas.Code)) },
		up:         func() { k.failOn.Store(0) },
		deliveries: k.deliveries,
		breaks:     true,
	})
}
