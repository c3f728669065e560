package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Outages per destination. A sink that delivers to several destinations
// which fail independently (sinks.Destinations: a webhook sink's hosts)
// does not share one breaker for the route: one host down must not hold
// back the others. Instead each destination found down (the same
// evidence as the route's breaker: see down) gets an outage of its own.
// While it lasts, the destination's messages are not sent: each is
// deferred, its row waiting until the destination's next probe without
// an attempt counted, and the later messages of its key wait behind it,
// as behind a retry. When the probe is due, one claimed message of the
// destination goes as the probe; the first that gets through (or fails
// on its own: the destination answered) ends the outage. A Retry-After
// that every message to a destination got, across keys, pauses that
// destination the same way, for as long as it asked. The route is ready
// while a destination delivers; with every one down it is not.

// destOutage is one destination's outage (or pause).
type destOutage struct {
	since, next time.Time
	cause       error
	probes      int
	probing     bool // its probe is in a batch in flight
	// paused: the destination asked to wait (a Retry-After on every
	// message to it) rather than being found down.
	paused bool
	bo     *backoff.ExponentialBackOff
}

// destinations holds the outages of a sink's destinations.
type destinations struct {
	sink  sinks.Destinations
	total int
	log   *slog.Logger
	now   func() time.Time

	mu   sync.Mutex
	down map[string]*destOutage
}

// newDestinations returns the per-destination outages of sink, nil when
// it delivers to one destination only (the route's breaker serves it).
func newDestinations(sink sinks.Sink, log *slog.Logger) *destinations {
	d, ok := sinks.As[sinks.Destinations](sink)
	if !ok || d.Destinations() < 2 {
		return nil
	}
	return &destinations{sink: d, total: d.Destinations(), log: log, now: time.Now, down: map[string]*destOutage{}}
}

// gate says, before a send, which messages of batch go: nil for those
// that do, a *deferredError for those whose destination is down (at most
// one message a destination goes as its probe, when it is due). probes
// names the destinations probed by this batch.
func (ds *destinations) gate(batch []claim.Row) (pre []error, probes map[string]bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if len(ds.down) == 0 {
		return nil, nil
	}
	now := ds.now()
	pre = make([]error, len(batch))
	for i := range batch {
		dest := ds.sink.Destination(batch[i].Msg)
		o := ds.down[dest]
		if o == nil {
			continue
		}
		if !o.probing && !now.Before(o.next) {
			o.probing = true
			if probes == nil {
				probes = map[string]bool{}
			}
			probes[dest] = true
			continue
		}
		until := now.Add(probeInitial)
		if o.next.After(until) {
			until = o.next
		}
		pre[i] = &claim.Deferred{Dest: dest, Until: until, Cause: o.cause}
	}
	return pre, probes
}

// judge reads the sink's answer to batch (sendErr) destination by
// destination, with the evidence down and slowDown weigh for a route:
// the messages of a destination found down, or paused, become deferred
// (no attempt counted), and a destination whose probe got through, or
// failed on its own, is back. It returns the answer as the settlement
// must read it.
func (ds *destinations) judge(batch []claim.Row, sendErr error, probes map[string]bool, confirm func(sinks.Message) error) error {
	if sendErr == nil && len(probes) == 0 {
		return nil
	}
	groups := map[string][]int{}
	var order []string
	for i := range batch {
		dest := ds.sink.Destination(batch[i].Msg)
		if claim.DeferredBy(sinks.Outcome(sendErr, i, len(batch))) != nil {
			continue // not sent
		}
		if _, ok := groups[dest]; !ok {
			order = append(order, dest)
		}
		groups[dest] = append(groups[dest], i)
	}
	be := sinks.NewBatchError(len(batch))
	for i := range batch {
		be.Errs[i] = sinks.Outcome(sendErr, i, len(batch))
	}
	for _, dest := range order {
		ds.judgeOne(dest, batch, be, groups[dest], probes[dest], confirm)
	}
	for dest := range probes {
		if _, sent := groups[dest]; !sent {
			ds.probeEnded(dest) // its probe message was held behind its key
		}
	}
	return be.Err()
}

// judgeOne judges the messages idx of batch, all to dest, and rewrites
// their entries of be when dest is down or paused.
func (ds *destinations) judgeOne(dest string, batch []claim.Row, be *sinks.BatchError, idx []int, probe bool, confirm func(sinks.Message) error) {
	sub := make([]claim.Row, len(idx))
	subErr := sinks.NewBatchError(len(idx))
	for j, i := range idx {
		sub[j], subErr.Errs[j] = batch[i], be.Errs[i]
	}
	v, cause := down(sub, subErr.Err(), probe, confirm)
	wait, slow := slowDown(sub, subErr.Err())
	switch {
	case dest == "":
		// No destination: each message fails on its own.
	case v == isDown || wait > 0:
		if wait > 0 {
			cause = slow
		}
		until := ds.failed(dest, probe, cause, wait)
		for _, i := range idx {
			if err := be.Errs[i]; err != nil && !isHeldBack(err) {
				be.Errs[i] = &claim.Deferred{Dest: dest, Until: until, Cause: err}
			}
		}
	case v == reached:
		ds.reached(dest)
	default:
		if probe {
			ds.probeEnded(dest)
		}
	}
}

// isHeldBack reports whether err is a message held behind an earlier
// failure of its key, not a failure of its own.
func isHeldBack(err error) bool {
	return errors.Is(err, sinks.ErrNotAttempted) && !sinks.IsNotSent(err)
}

// failed records that dest was found down (or asked to wait for wait) by
// a batch, probe or not, and returns when its messages may go again.
func (ds *destinations) failed(dest string, probe bool, cause error, wait time.Duration) time.Time {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	now := ds.now()
	o := ds.down[dest]
	if o == nil {
		bo := backoff.NewExponentialBackOff()
		bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = probeInitial, probeMax, 0
		o = &destOutage{since: now, cause: cause, paused: wait > 0, bo: bo}
		ds.down[dest] = o
		ds.log.Warn("destination unavailable; its messages wait, counting no attempt, and one at a time goes as a probe until it is back; the other destinations deliver",
			"destination", dest, "error", cause)
		o.next = now.Add(max(o.bo.NextBackOff(), wait))
		return o.next
	}
	o.cause, o.paused = cause, wait > 0
	if probe {
		// The probe found it down still: the next one waits longer.
		o.probes++
		o.probing = false
		o.next = now.Add(max(o.bo.NextBackOff(), wait))
	} else if until := now.Add(wait); until.After(o.next) {
		o.next = until // a batch claimed before it was found down
	}
	return o.next
}

// reached records that dest answered: its outage, if any, is over.
func (ds *destinations) reached(dest string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if o := ds.down[dest]; o != nil {
		delete(ds.down, dest)
		ds.log.Info("destination is back; delivering", "destination", dest,
			"down_for", ds.now().Sub(o.since).Round(time.Millisecond), "probes", o.probes)
	}
}

// probeEnded lets dest's next probe go: this one neither got through nor
// found it down.
func (ds *destinations) probeEnded(dest string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if o := ds.down[dest]; o != nil {
		o.probing = false
	}
}

// abandon ends the probes of a batch that was never judged (the database
// failed it).
func (ds *destinations) abandon(probes map[string]bool) {
	for dest := range probes {
		ds.probeEnded(dest)
	}
}

// fill adds the destinations' outages to a route state, so that
// status, metrics and the console say what /readyz says: every
// destination down is the route's destination down; some of them, a
// degraded route (some messages cannot be delivered).
func (ds *destinations) fill(st *RouteState) {
	n, text := ds.state()
	if n == 0 {
		return
	}
	ds.mu.Lock()
	since := time.Time{}
	for _, o := range ds.down {
		if since.IsZero() || o.since.Before(since) {
			since = o.since
		}
	}
	ds.mu.Unlock()
	switch {
	case n == ds.total && !st.Open:
		st.Open, st.Since, st.Cause = true, since, errors.New(text)
	case n < ds.total && !st.Failing:
		st.Failing, st.FailingSince, st.LastError = true, since, errors.New(text)
	}
}

// state says how many destinations are down and which, worst first by
// name: "" when none is.
func (ds *destinations) state() (n int, text string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	now := ds.now()
	names := make([]string, 0, len(ds.down))
	for dest, o := range ds.down {
		if !o.probing && now.Sub(o.next) > 2*probeMax {
			// No message of it came to probe with: there is none to
			// deliver, and the next one will tell whether it is back.
			delete(ds.down, dest)
			continue
		}
		names = append(names, dest)
	}
	if len(names) == 0 {
		return 0, ""
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, dest := range names {
		o := ds.down[dest]
		if o.paused {
			parts[i] = fmt.Sprintf("%s paused until %s: %v", dest, o.next.UTC().Format(time.RFC3339), o.cause)
			continue
		}
		parts[i] = fmt.Sprintf("%s since %s (%d probes since): %v", dest, o.since.UTC().Format(time.RFC3339), o.probes, o.cause)
	}
	return len(names), fmt.Sprintf("%d of %d destinations unavailable: %s", len(names), ds.total, strings.Join(parts, "; "))
}
