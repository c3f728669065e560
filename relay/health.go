package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Live reports whether every worker's loop has turned recently (within
// PublishTimeout, PollInterval and two minutes), without the database.
func (r *Relay) Live() error {
	limit := r.cfg.PublishTimeout + r.cfg.PollInterval + 2*time.Minute
	now := time.Now()
	for i, w := range r.workers {
		last := w.lastLoop.Load()
		if last == 0 {
			continue // not started yet
		}
		if age := now.Sub(time.Unix(0, last)); age > limit {
			return fmt.Errorf("outbox: worker %d stuck for %s", i, age.Round(time.Second))
		}
	}
	return nil
}

// Ready reports whether the relay can do its job right now: not draining,
// its lane lease renewed within the lease TTL, the database reachable, its
// destination up (the sink healthy when it can tell, the outage breaker
// closed: see Hooks.Outage). It answers for this relay only: lanes of its
// route that no relay works are reported to Hooks.UnworkedLanes, not here.
func (r *Relay) Ready(ctx context.Context) error {
	if err := r.readyToClaim(ctx); err != nil {
		return err
	}
	return r.destinationUp(ctx)
}

// Readiness is Ready, and what slows the route while it still delivers
// ("" when nothing does): its rate limit or its failing messages.
func (r *Relay) Readiness(ctx context.Context) (degraded string, err error) {
	if err := r.Ready(ctx); err != nil {
		return "", err
	}
	return r.strained(), nil
}

// strained says what slows the route while its destination is up: the
// rate limit (or a Retry-After) it waits for, or messages failing since
// when and why; "" when nothing does.
func (r *Relay) strained() string {
	st := r.State()
	say := func(what string, t time.Time, why error) string {
		s := what + " since " + t.UTC().Format(time.RFC3339)
		if why != nil {
			s += ": " + why.Error()
		}
		return s
	}
	if r.dests != nil {
		if _, text := r.dests.state(); text != "" {
			return "outbox: degraded: " + text
		}
	}
	switch {
	case st.Open:
		return ""
	case st.Limited:
		return say("outbox: rate limited", st.LimitedSince, st.LimitCause)
	case st.Failing:
		return say("outbox: messages failing", st.FailingSince, st.LastError)
	}
	return ""
}

// readyToClaim is the part of Ready that concerns the relay and its
// database, not where its messages go.
func (r *Relay) readyToClaim(ctx context.Context) error {
	if r.draining.Load() {
		return errors.New("outbox: draining")
	}
	if err := r.schemaErr.Load(); err != nil {
		return *err
	}
	if err := r.lease.Conflict(); err != nil {
		return err
	}
	if d, starved := r.starved(); starved {
		return fmt.Errorf("outbox: database: a worker has had no connection for %s (its lanes are handed to other relays)", d.Round(time.Second))
	}
	if err := r.lease.Healthy(); err != nil {
		return err
	}
	readOnly, err := store.ReadOnly(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("outbox: database: %w", err)
	}
	if readOnly {
		return errors.New("outbox: database: read-only (a standby, or default_transaction_read_only is on)")
	}
	return nil
}

// destinationUp is the part of Ready that concerns the route's
// destination: the breaker closed, the sink healthy.
func (r *Relay) destinationUp(ctx context.Context) error {
	if st := r.brk.State(); st.Open {
		return fmt.Errorf("outbox: destination down since %s (%d probes since): %w",
			st.Since.UTC().Format(time.RFC3339), st.Probes, st.Cause)
	}
	if r.dests != nil {
		if n, text := r.dests.state(); n == r.dests.total {
			return errors.New("outbox: " + text)
		}
	}
	if hc, ok := r.sink.(sinks.HealthChecker); ok {
		if err := hc.Healthy(ctx); err != nil {
			return fmt.Errorf("outbox: sink: %w", err)
		}
	}
	return nil
}
