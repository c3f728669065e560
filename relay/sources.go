package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/internal/service"
	"github.com/outbox-relay/outbox-relay/relay/internal/share"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Source is one outbox that a Sources relays from: a database, through
// its pool, and a schema of it, with the routes of its messages.
type Source struct {
	// Name names the source in logs, status and metrics: 1-63 lower-case
	// letters, digits, '.', '_' or '-', unique among the Sources.
	// Required.
	Name string
	// Pool connects to the source's database. Required. Sources does not
	// close it.
	Pool *pgxpool.Pool
	// Set configures the source's relays as NewSet does: Set.Config.Schema
	// is the source's schema, Set.Routes its routes. Without routes, one
	// relay of Set.Config delivers every topic to Sink, as New does.
	Set SetConfig
	// Sink receives the source's messages when Set has no routes. Several
	// sources may share a sink; Sources does not close it.
	Sink sinks.Sink
	// Weight is the source's part of SourcesConfig.Batches beside the
	// other sources that have work: a source of weight 2 may have twice
	// the batches under way of a source of weight 1. Default 1.
	Weight int
}

// SourcesConfig configures a Sources.
type SourcesConfig struct {
	// Sources, at least one.
	Sources []Source
	// Logger logs a source's failures and restarts; each source's relays
	// log with a "source" attribute. Default: the first source's
	// Set.Config.Logger, else slog.Default.
	Logger *slog.Logger
	// RestartMax caps the wait before a source whose relays stopped with
	// an error starts again (the waits grow from a second). Default 1 min.
	RestartMax time.Duration
	// Batches is how many batches the sources have under way at once,
	// all together, while several of them have work (a batch is under
	// way from its claim until its sink answered; a source has work while
	// it has one, and for 100 ms after): each source may have its part of
	// them by Weight, at least one, and its workers' next claims wait for
	// one of its own to end. A source draining a backlog then takes its
	// part of its database, the sinks and the process's cores, not all
	// of them. A source alone, the others idle, is not held back: its
	// relays' Workers × Pipeline apply. Default DefaultSourceBatches.
	Batches int
}

// DefaultSourceBatches is SourcesConfig.Batches by default: one relay's
// batches in flight by default (DefaultWorkers × DefaultPipeline).
const DefaultSourceBatches = DefaultWorkers * DefaultPipeline

// Sources relays from several outboxes in one process: a database per
// service, per tenant or per region, each source with its own pool,
// lanes and workers, so that one source's backlog or outage does not
// delay the others. A source whose relays stop with an error (its
// database down at start, its schema refused) is reported and started
// again after a growing wait, while the others run on.
type Sources struct {
	log        *slog.Logger
	restartMax time.Duration
	gate       *share.Gate // the sources' batches (SourcesConfig.Batches)

	mu   sync.Mutex
	srcs []*sourceRun
	// run is Run's context (nil before Run): a source added then starts
	// at once.
	run context.Context
	wg  sync.WaitGroup
}

// sourceRun is one Source at run time.
type sourceRun struct {
	Source
	// stop ends the source's loop; done is closed once it returned (nil
	// before it started).
	stop context.CancelFunc
	done chan struct{}
	// member is the source's part of the batches.
	member *share.Member

	mu       sync.Mutex
	unit     unit // the running relay or Set; nil while down
	state    SourceState
	restarts int
}

// unit is what a source runs: a Relay (no routes) or a Set.
type unit interface {
	Run(ctx context.Context) error
	Live() error
	Readiness(ctx context.Context) (string, error)
	Relays() []*Relay
}

// Relays returns r itself, so that a Relay and a Set answer alike.
func (r *Relay) Relays() []*Relay { return []*Relay{r} }

// The states of a source (SourceState.State).
const (
	SourceStarting = "starting" // its relays run their start-up checks
	SourceRunning  = "running"  // its relays run
	SourceDown     = "down"     // its relays stopped with an error (they start again at Retry), or run but cannot reach its database
	SourceStopped  = "stopped"  // Run returned
)

// SourceState is what a source is doing.
type SourceState struct {
	// Name is the source's name.
	Name string
	// State is SourceStarting, SourceRunning, SourceDown or SourceStopped.
	State string
	// Since is when it entered State.
	Since time.Time
	// Err is why it is down (nil otherwise).
	Err error
	// Retry is when a source that is down starts again (past once it
	// runs its start-up checks again: it stays down until its relays
	// run); zero for a source whose relays run but cannot renew their
	// lane lease (its database went away while they ran): they retry by
	// themselves.
	Retry time.Time
	// Restarts counts its starts after the first.
	Restarts int
	// ShareWait is how long its workers have waited, in all, for its
	// part of the batches under way while other sources had work (see
	// SourcesConfig.Batches): time a busy source was held back.
	ShareWait time.Duration
}

// NewSources validates c and prepares its sources; nothing connects
// before Run.
func NewSources(c SourcesConfig) (*Sources, error) {
	if len(c.Sources) == 0 {
		return nil, errors.New("outbox: sources: at least one source is required")
	}
	if c.Batches < 0 {
		return nil, fmt.Errorf("outbox: sources: batches: must be 1 or more (0: %d), got %d", DefaultSourceBatches, c.Batches)
	}
	if c.Batches == 0 {
		c.Batches = DefaultSourceBatches
	}
	s := &Sources{log: c.Logger, restartMax: c.RestartMax, gate: share.New(c.Batches)}
	if s.restartMax <= 0 {
		s.restartMax = time.Minute
	}
	if s.log == nil {
		s.log = c.Sources[0].Set.Config.Logger
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	for i, src := range c.Sources {
		if err := s.add(fmt.Sprintf("sources[%d]", i), src); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Add adds a source, and starts it at once when Run runs: a relay
// process takes a new tenant's database without a restart. Its schema
// must be migrated first; until it is, the source is down and started
// again, as any source that fails. The rules of SourcesConfig.Sources
// apply, its name unique among the sources Sources runs.
func (s *Sources) Add(src Source) error {
	return s.add("source", src)
}

// add checks src, under the name field in errors, and adds it.
func (s *Sources) add(field string, src Source) error {
	switch {
	case !routeName.MatchString(src.Name):
		return fmt.Errorf("outbox: %s.name: %q must be 1-63 lower-case letters, digits, '.', '_' or '-'", field, src.Name)
	case src.Pool == nil:
		return fmt.Errorf("outbox: %s.pool: required", field)
	case src.Weight < 0:
		return fmt.Errorf("outbox: %s.weight: must be 1 or more (0: 1), got %d", field, src.Weight)
	}
	src.Set = src.logged(s.log)
	if _, err := src.build(nil); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, other := range s.srcs {
		if other.Name == src.Name {
			return fmt.Errorf("outbox: %s.name: %q used twice", field, src.Name)
		}
	}
	sr := &sourceRun{Source: src, state: SourceState{Name: src.Name, State: SourceStarting, Since: time.Now()}}
	sr.member = s.gate.Join(src.Weight)
	s.srcs = append(s.srcs, sr)
	if s.run != nil {
		s.start(sr)
	}
	return nil
}

// Remove stops source name, letting its in-flight batches finish (see
// Relay.Run), and forgets it; its undelivered messages wait in its
// outbox. It returns once the source's relays stopped, and an error when
// no source has that name.
func (s *Sources) Remove(name string) error {
	s.mu.Lock()
	i := slices.IndexFunc(s.srcs, func(sr *sourceRun) bool { return sr.Name == name })
	if i < 0 {
		s.mu.Unlock()
		return fmt.Errorf("outbox: source: no source named %q", name)
	}
	sr := s.srcs[i]
	s.srcs = slices.Delete(s.srcs, i, i+1)
	s.mu.Unlock()
	if sr.stop != nil {
		sr.stop()
		<-sr.done
	}
	sr.member.Leave()
	return nil
}

// start runs sr's loop under Run's context; s.mu is held.
func (s *Sources) start(sr *sourceRun) {
	ctx, stop := context.WithCancel(s.run)
	sr.stop, sr.done = stop, make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(sr.done)
		s.runSource(ctx, sr)
	}()
}

// list returns the sources, in the order they were added.
func (s *Sources) list() []*sourceRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.srcs)
}

// logged returns src.Set whose relays log with the source's name.
func (src Source) logged(fallback *slog.Logger) SetConfig {
	sc := src.Set
	with := func(l *slog.Logger) *slog.Logger {
		if l == nil {
			l = fallback
		}
		return l.With("source", src.Name)
	}
	sc.Config.Logger = with(sc.Config.Logger)
	sc.Routes = append([]Route(nil), sc.Routes...)
	for i, rt := range sc.Routes {
		if rt.Config != nil {
			cfg := *rt.Config
			cfg.Logger = with(cfg.Logger)
			sc.Routes[i].Config = &cfg
		}
	}
	return sc
}

// build makes the source's relays, their batches under member (nil: not
// shared): a Set, or one relay without routes.
func (src Source) build(member *share.Member) (unit, error) {
	src.Set.Config.share = member
	if len(src.Set.Routes) > 0 {
		return NewSet(src.Pool, src.Set)
	}
	if src.Sink == nil {
		return nil, errors.New("outbox: sink: required when the source has no routes")
	}
	cfg := src.Set.Config
	if src.Set.Hooks != nil {
		if h := src.Set.Hooks(cfg.Route); h != nil {
			cfg.Hooks = h
		}
	}
	return New(src.Pool, src.Sink, cfg)
}

// Run runs every source until ctx is cancelled, then drains them (see
// Relay.Run) and returns nil. A source whose relays stop with an error is
// logged, reported as down (States, Readiness) and started again, after
// a wait that grows from a second to RestartMax while it keeps failing.
func (s *Sources) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.run != nil {
		s.mu.Unlock()
		return errors.New("outbox: Sources.Run called twice")
	}
	s.run = ctx
	for _, sr := range s.srcs {
		s.start(sr)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.wg.Wait()
	return nil
}

// runSource runs src, starting it again after each failure, until ctx
// ends.
func (s *Sources) runSource(ctx context.Context, src *sourceRun) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = time.Second, s.restartMax, 0
	bo.Reset()
	for {
		began := time.Now()
		err := s.runOnce(ctx, src)
		if ctx.Err() != nil {
			src.set(SourceState{State: SourceStopped}, nil)
			return
		}
		if err == nil {
			err = errors.New("outbox: relays stopped")
		}
		if time.Since(began) > s.restartMax {
			bo.Reset() // it ran a while: a new failure, not the same one
		}
		wait := bo.NextBackOff()
		src.set(SourceState{State: SourceDown, Err: err, Retry: time.Now().Add(wait)}, nil)
		s.log.Error("source down; its relays start again later", "source", src.Name, "error", err, "retry_in", wait.Round(time.Millisecond))
		service.Sleep(ctx, wait)
		if ctx.Err() != nil {
			src.set(SourceState{State: SourceStopped}, nil)
			return
		}
		src.mu.Lock()
		src.restarts++
		src.mu.Unlock()
	}
}

// runOnce builds src's relays and runs them until they return.
func (s *Sources) runOnce(ctx context.Context, src *sourceRun) error {
	u, err := src.build(src.member)
	if err != nil {
		return err
	}
	src.starting(u)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Running once every relay has passed its start-up checks and
		// started its lease; starting until then.
		for _, r := range u.Relays() {
			select {
			case <-ctx.Done():
				return
			case <-r.running:
			}
		}
		src.promote(u)
	}()
	return u.Run(ctx)
}

// set records src's new state and its running unit (nil: none).
func (src *sourceRun) set(st SourceState, u unit) {
	src.mu.Lock()
	defer src.mu.Unlock()
	st.Name, st.Since, st.Restarts = src.Name, time.Now(), src.restarts
	if st.State == SourceDown && src.state.State == SourceDown {
		st.Since = src.state.Since // down since its first failure in a row
	}
	src.state, src.unit = st, u
}

// promote marks src running if u is still what it runs.
func (src *sourceRun) promote(u unit) {
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.unit == u && src.state.State != SourceRunning {
		src.state = SourceState{Name: src.Name, State: SourceRunning, Since: time.Now(), Restarts: src.restarts}
	}
}

// starting records that src runs u's start-up checks. A source that is
// down stays down until its relays run, so that its state does not flip
// between down and starting while it keeps failing (an alert on "down
// for 5 minutes" would never fire).
func (src *sourceRun) starting(u unit) {
	src.mu.Lock()
	defer src.mu.Unlock()
	src.unit = u
	if src.state.State != SourceDown {
		src.state = SourceState{Name: src.Name, State: SourceStarting, Since: time.Now(), Restarts: src.restarts}
	}
}

// current returns src's state and running unit. A source whose relays
// run but have not renewed their lane lease for longer than its TTL (its
// database went away, or stopped answering) is down meanwhile, though
// its relays keep running and retrying.
func (src *sourceRun) current() (SourceState, unit) {
	src.mu.Lock()
	st, u := src.state, src.unit
	src.mu.Unlock()
	if src.member != nil {
		st.ShareWait = src.member.Waited()
	}
	if st.State == SourceRunning && u != nil {
		if since, err := lapsed(u); err != nil {
			st.State, st.Since, st.Err = SourceDown, since, err
		}
	}
	return st, u
}

// lapsed reports the first relay of u whose lane lease has not been
// renewed for longer than its TTL: since when that holds, and why.
func lapsed(u unit) (time.Time, error) {
	for _, r := range u.Relays() {
		last := r.lease.LastRenewed()
		if last.IsZero() || time.Since(last) <= r.cfg.LeaseTTL {
			continue
		}
		return last.Add(r.cfg.LeaseTTL), fmt.Errorf("outbox: database: the lane lease has not been renewed since %s (lease TTL %s); the relays retry",
			last.UTC().Format(time.RFC3339), r.cfg.LeaseTTL)
	}
	return time.Time{}, nil
}

// States returns every source's state, in the order of
// SourcesConfig.Sources.
func (s *Sources) States() []SourceState {
	srcs := s.list()
	out := make([]SourceState, len(srcs))
	for i, src := range srcs {
		out[i], _ = src.current()
	}
	return out
}

// SourceRelays returns the relays that source name runs now (none while
// it is down), in the order of SetConfig.Plan.
func (s *Sources) SourceRelays(name string) []*Relay {
	for _, src := range s.list() {
		if src.Name != name {
			continue
		}
		if _, u := src.current(); u != nil {
			return u.Relays()
		}
	}
	return nil
}

// Live reports the first source whose relays run but are not live (see
// Relay.Live). A source that is down is not a liveness failure: Sources
// starts it again, and restarting the process would not help the others.
func (s *Sources) Live() error {
	for _, src := range s.list() {
		if _, u := src.current(); u != nil {
			if err := u.Live(); err != nil {
				return fmt.Errorf("source %s: %w", src.Name, err)
			}
		}
	}
	return nil
}

// Ready reports whether some source can deliver (see Readiness).
func (s *Sources) Ready(ctx context.Context) error {
	_, err := s.Readiness(ctx)
	return err
}

// Readiness is an error naming every source when none can deliver
// (each down, starting, or not ready as Set.Readiness says); otherwise
// nil, and the sources that are down or slowed, one a line ("" when
// none is).
func (s *Sources) Readiness(ctx context.Context) (degraded string, err error) {
	srcs := s.list()
	if len(srcs) == 0 {
		return "", errors.New("outbox: no source to relay from")
	}
	// Each source's database is asked at once: one that does not answer
	// must not use up the others' share of ctx.
	whys, slows := make([]string, len(srcs)), make([]string, len(srcs))
	var wg sync.WaitGroup
	for i, src := range srcs {
		wg.Go(func() { whys[i], slows[i] = src.readiness(ctx) })
	}
	wg.Wait()
	var down, strained []string
	for i, src := range srcs {
		switch {
		case whys[i] != "":
			down = append(down, "source "+src.Name+": "+whys[i])
		case slows[i] != "":
			strained = append(strained, "source "+src.Name+": "+slows[i])
		}
	}
	if len(down) == len(srcs) {
		return "", errors.New(strings.Join(down, "\n"))
	}
	return strings.Join(append(down, strained...), "\n"), nil
}

// readiness says why src cannot deliver ("" when it can), and what slows
// it.
func (src *sourceRun) readiness(ctx context.Context) (why, slow string) {
	st, u := src.current()
	switch {
	case st.State == SourceDown:
		again := "starts again at " + st.Retry.UTC().Format(time.RFC3339)
		switch {
		case st.Retry.IsZero():
			again = "its relays run and retry"
		case time.Now().After(st.Retry):
			again = "starting again"
		}
		return fmt.Sprintf("down since %s (%s): %v", st.Since.UTC().Format(time.RFC3339), again, st.Err), ""
	case u == nil || st.State == SourceStarting:
		return "starting", ""
	}
	slow, err := u.Readiness(ctx)
	if err != nil {
		return err.Error(), ""
	}
	return "", slow
}
