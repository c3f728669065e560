package relay

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// The outage breaker. When a batch finds the destination unavailable as a
// whole (nothing got through, nothing failed on its own, and the failures
// are evidence of it: a connection that could not be made, or answers
// that say "unavailable" which the sink's Prober confirms or, for a sink
// without one, that span two keys; see down), the batch rolls back
// without counting an attempt, and the route stops claiming: while the
// breaker is open, one worker at a time probes the destination with a
// batch of one message, on a backoff (probeInitial doubling up to
// probeMax, or what the destination asked for with Retry-After). The
// first probe that gets through closes the breaker and every worker
// claims at full speed again. A probe that finds the destination down
// counts no attempt either. A probe whose failure is its own (the Prober
// finds the destination up) counts its attempt and closes the breaker,
// and the probes rotate over the workers, and so over the lanes and
// keys: messages that fail while their destination is up are poison,
// not an outage, and are dead-lettered after their attempts. A message
// that fails on its own (a 4xx, too large, unroutable) never opens the
// breaker.

const (
	probeInitial = 500 * time.Millisecond
	probeMax     = 5 * time.Second
)

// errDestinationDown: no message of a batch got through and every failure
// said the destination was unavailable or the message was not attempted.
// The batch rolls back untouched and the breaker opens.
var errDestinationDown = errors.New("outbox: destination unavailable")

// RouteState is a route's delivery state (docs/operations.md, "Route
// health"): what its outage breaker says (Open), whether it waits for a
// rate limit (Limited) and whether its messages fail (Failing). Health
// names the worst of them.
type RouteState struct {
	// Open: the destination was found unavailable since Since (Cause
	// says why); the route claims one message at a time, as a probe,
	// until one gets through. Probes counts those that found it down.
	Open   bool
	Since  time.Time
	Cause  error
	Probes int
	// PausedUntil: the destination asked the route to wait (a 429 with
	// Retry-After); it claims nothing before then.
	PausedUntil time.Time
	// Limited: within the last heartbeat interval the route waited for
	// its rate limit or a Retry-After, since LimitedSince, for LimitCause.
	Limited      bool
	LimitedSince time.Time
	LimitCause   error
	// Failing: messages failed and counted an attempt since FailingSince;
	// LastError is the latest. A heartbeat interval with deliveries and
	// no failure ends it.
	Failing      bool
	FailingSince time.Time
	LastError    error
}

// breaker is a route's outage breaker, shared by its workers.
type breaker struct {
	workers int
	log     *slog.Logger
	hooks   Hooks
	sig     *testsig.Bus
	now     func() time.Time
	// wake wakes worker w: a worker idle with nothing to claim does not
	// ask the breaker, and the turn to probe may come to it.
	wake func(w int)

	mu      sync.Mutex
	state   RouteState
	next    time.Time // when the next probe may go
	turn    int       // the worker whose claim is the next probe
	probing bool      // the probe is in flight
	empty   int       // probes in a row that found nothing to send
	// paused: the destination asked the route to slow down (see pause):
	// no claim before then.
	paused time.Time
	bo     *backoff.ExponentialBackOff
	// changed is closed (and replaced) whenever a waiting worker may be
	// let through: the breaker closed, or the turn to probe moved.
	changed chan struct{}
}

func newBreaker(workers int, log *slog.Logger, hooks Hooks, sig *testsig.Bus, wake func(w int)) *breaker {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = probeInitial, probeMax, 0
	return &breaker{workers: workers, log: log, hooks: hooks, sig: sig, now: time.Now, wake: wake, bo: bo, changed: make(chan struct{})}
}

// admission is what the breaker lets a worker claim.
type admission struct {
	ok    bool // it may claim
	probe bool // its claim is the probe: one message
	// Otherwise: wait for changed, or until at (zero: no time).
	changed <-chan struct{}
	at      time.Time
}

// admit says whether worker may claim now, and how much.
func (b *breaker) admit(worker int) admission {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := b.now(); now.Before(b.paused) {
		return admission{changed: b.changed, at: b.paused}
	}
	if !b.state.Open {
		return admission{ok: true}
	}
	if worker == b.turn && !b.probing {
		if !b.now().Before(b.next) {
			b.probing = true
			return admission{ok: true, probe: true}
		}
		return admission{changed: b.changed, at: b.next}
	}
	return admission{changed: b.changed}
}

// landed records how a batch of worker ended: down (it found the
// destination unavailable, cause says how), nothing (a probe that found
// no message to send), or through (anything else: a message got through,
// or failed on its own).
func (b *breaker) landed(worker int, probe bool, o outcome, cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case o == wentThrough:
		b.empty = 0
		if b.state.Open {
			b.closeLocked()
		}
	case o == foundNothing:
		if !probe || !b.state.Open {
			return
		}
		// Nothing in this worker's lanes: the next worker probes at once.
		// When none has anything, there is nothing to probe with, and the
		// next batch says whether the destination is back.
		b.empty++
		b.passTurnLocked()
		if b.empty >= b.workers {
			b.closeLocked()
		}
	case !b.state.Open:
		b.state = RouteState{Open: true, Since: b.now(), Cause: cause}
		b.empty = 0
		b.bo.Reset()
		b.next = b.probeAt(cause)
		b.turn = worker
		b.log.Warn("destination unavailable; claiming nothing but one message at a time as a probe until it is back",
			"error", cause, "probe_in", b.next.Sub(b.now()).Round(time.Millisecond))
		b.hooks.Outage(true, b.state.Since, cause)
		b.sig.Emit(testsig.Outage, 1)
	case probe:
		b.state.Cause = cause
		b.state.Probes++
		b.empty = 0
		b.next = b.probeAt(cause)
		b.passTurnLocked()
		b.sig.Emit(testsig.Probed, b.state.Probes)
	default:
		// A batch claimed before the breaker opened.
		b.state.Cause = cause
	}
}

// probeAt is when the next probe goes: after the backoff, or after what
// the destination asked for (sinks.RetryAfter), whichever is later.
func (b *breaker) probeAt(cause error) time.Time {
	d := b.bo.NextBackOff()
	if ra, ok := sinks.RetryAfter(cause); ok {
		d = max(d, ra)
	}
	return b.now().Add(d)
}

// pause stops the route's claims for d from now (the destination asked
// for it: a 429 with Retry-After), unless it is paused longer already.
func (b *breaker) pause(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	until := b.now().Add(d)
	if until.After(b.paused) {
		if !b.now().Before(b.paused) {
			b.log.Info("the destination asked to slow down; the route claims nothing until then", "for", d.Round(time.Millisecond))
		}
		b.paused = until
	}
}

// slowDown is how long a batch's answer asks the whole route to wait:
// when nothing of the batch got through and every message the sink tried
// was answered with a Retry-After (sinks.RetryAfter: a 429 to every
// request, a broker's throttle) across two keys or more (a keyless
// message is a key of its own), the longest of those delays; 0 otherwise.
// A Retry-After for one key's message says something of that message,
// or of that key: it waits in that message's row as its retry delay (see
// ExponentialRetry), holding back its key only, and the route goes on.
// cause is the error that asked for the wait.
func slowDown(batch []claim.Row, sendErr error) (d time.Duration, cause error) {
	if sendErr == nil {
		return 0, nil
	}
	first, spans := -1, false
	for i := range batch {
		err := sinks.Outcome(sendErr, i, len(batch))
		if errors.Is(err, sinks.ErrNotAttempted) || sinks.IsPermanent(err) {
			continue
		}
		ra, ok := sinks.RetryAfter(err)
		if !ok {
			return 0, nil // delivered, or failed without asking to wait
		}
		if first < 0 {
			first = i
		} else if k := batch[i].Msg.Key; k == "" || k != batch[first].Msg.Key {
			spans = true
		}
		if ra > d {
			d, cause = ra, err
		}
	}
	if !spans {
		return 0, nil
	}
	return d, cause
}

// abandon ends a probe that neither claimed nor published (the database
// failed it): the same worker probes again.
func (b *breaker) abandon() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// passTurnLocked gives the next probe to the next worker, and wakes it.
func (b *breaker) passTurnLocked() {
	b.turn = (b.turn + 1) % b.workers
	close(b.changed)
	b.changed = make(chan struct{})
	b.wake(b.turn)
}

// closeLocked closes the breaker: every worker claims again.
func (b *breaker) closeLocked() {
	since := b.state.Since
	b.log.Info("destination is back; delivering", "down_for", b.now().Sub(since).Round(time.Millisecond), "probes", b.state.Probes)
	b.state = RouteState{}
	b.empty = 0
	close(b.changed)
	b.changed = make(chan struct{})
	b.hooks.Outage(false, since, nil)
	b.sig.Emit(testsig.Outage, 0)
}

// State returns the breaker's state.
func (b *breaker) State() RouteState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.state
	if b.now().Before(b.paused) {
		st.PausedUntil = b.paused
	}
	return st
}

// outcome is how a batch ended, for the breaker.
type outcome uint8

const (
	wentThrough  outcome = iota // a message got through, or failed on its own
	foundDown                   // the destination is unavailable as a whole
	foundNothing                // the claim found no message
)

// reading is what a batch's answer says about the destination.
type reading uint8

const (
	reached   reading = iota // something got through, or failed on its own
	isDown                   // the destination is down as a whole
	untouched                // nothing was attempted, and nothing says why
)

// down reads a sink's answer to a batch: isDown when no message got
// through, none failed on its own, and the failures are evidence enough
// that the destination is down. A message not sent (sinks.NotSent: a
// refused connection, an unresolvable host) is. sinks.ErrUnavailable (a
// 503, a timeout) is evidence when confirm, the sink's sinks.Prober,
// finds the destination of the first such message down too: a webhook
// receiver that answers 503 to one message may take every other one, and
// only a request without a message tells the two apart. For a sink
// without a Prober (confirm nil) it is evidence when it spans two keys or
// more (or keyless messages), since one key's 503 may be that message's
// own, or when the batch is the breaker's probe, which the breaker opened
// on such evidence. A batch whose every message was not attempted
// without such evidence (held behind its key, the sink broke off, waited
// for its own rate limit) is untouched: the worker backs off, as after a
// failed cycle, since claiming it again at once would spin. The first
// failure that is evidence is returned as the cause.
func down(batch []claim.Row, sendErr error, probe bool, confirm func(sinks.Message) error) (reading, error) {
	if sendErr == nil || len(batch) == 0 {
		return reached, nil
	}
	var cause error
	notSent, spans := false, false
	first := -1 // the first unavailable message
	for i := range batch {
		err := sinks.Outcome(sendErr, i, len(batch))
		switch {
		case err == nil, sinks.IsPermanent(err):
			return reached, nil
		case sinks.IsNotSent(err):
			notSent = true
		case errors.Is(err, sinks.ErrNotAttempted):
			continue // no evidence either way
		case errors.Is(err, sinks.ErrUnavailable):
			if first < 0 {
				first = i
			} else if k := batch[i].Msg.Key; k == "" || k != batch[first].Msg.Key {
				spans = true // a keyless message is a key of its own
			}
		default:
			return reached, nil
		}
		if cause == nil {
			cause = err
		}
	}
	switch {
	case cause == nil:
		return untouched, sendErr
	case notSent:
		return isDown, cause
	case confirm != nil:
		if confirm(batch[first].Msg) != nil {
			return isDown, cause
		}
		return reached, nil
	case spans || probe:
		return isDown, cause
	}
	return reached, nil
}
