package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/topic"
)

// Route names the Set gives the relays it adds. Route names cannot start
// with '~', so the router's cannot clash with a route's.
const (
	// RouterRoute is the fan-out router's route: it copies messages to
	// the routes it feeds (see SetConfig.Feeds).
	RouterRoute = "~fanout"
	// UnroutedRoute dead-letters messages no route takes, with the
	// reason `no route matches topic "…"`, so that an operator sees them
	// and can replay them once a route exists.
	UnroutedRoute = "unrouted"
)

// Route is one route of a Set: where the messages of some topics go.
type Route struct {
	// Name names the route in tables, logs and metrics: 1-63 lower-case
	// letters, digits, '.', '_' or '-', unique in the Set. Required.
	Name string
	// Topics are the route's topic patterns (package topic). Routes are
	// tried in order and the first whose patterns match a topic takes the
	// message. Required.
	Topics []string
	// FanOut makes the route receive a copy of every message its Topics
	// match, whichever route takes the message. Default false.
	FanOut bool
	// Sink receives the route's messages. Required. The Set does not
	// close it.
	Sink sinks.Sink
	// Config tunes the route's relay. It is a whole configuration (zero
	// fields take the package defaults, not SetConfig.Config's); the Set
	// sets its ID, Schema, Producer, Route and topics. Default
	// SetConfig.Config.
	Config *Config
}

// SetConfig configures a Set.
type SetConfig struct {
	// Config configures every route without one of its own and the
	// relays the Set adds; its ID, Schema and Producer are every route's.
	Config Config
	// Routes, in order of precedence. At least one.
	Routes []Route
	// Hooks, when set, gives the hooks of the relay serving route (a
	// route's Name, RouterRoute or UnroutedRoute), in place of its
	// Config.Hooks: metrics labelled by route. Default: Config.Hooks.
	Hooks func(route string) Hooks
	// IsolateRoutes feeds every route from the fan-out router's copies
	// instead of the outbox, so that a route's backlog cannot slow the
	// others, for a copy of every message (docs/operations.md, "Isolated
	// routes"). Default false.
	IsolateRoutes bool
	// ReadyOnEveryRoute makes Ready fail as soon as one route's
	// destination is down. Default false: only when every one is.
	ReadyOnEveryRoute bool
}

// Set runs the relays of several routes in one process, on one pool (see
// SetConfig.Plan), woken by one LISTEN. One relay failing stops the
// others.
type Set struct {
	relays []*Relay
	cfgs   []Config
	pool   *pgxpool.Pool
	schema string
	log    *slog.Logger
	// everyRoute: not ready when any route's destination is down
	// (SetConfig.ReadyOnEveryRoute).
	everyRoute bool
}

var routeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// NewSet validates c and builds the relays of its routes. The pool needs
// Conns connections at least (see Conns and NewPool).
func NewSet(pool *pgxpool.Pool, c SetConfig) (*Set, error) {
	cfgs, err := c.Plan()
	if err != nil {
		return nil, err
	}
	for i, rt := range c.Routes {
		if rt.Sink == nil {
			return nil, fmt.Errorf("outbox: routes[%d].sink: required", i)
		}
	}
	s := &Set{cfgs: cfgs, pool: pool, schema: cfgs[0].Schema, log: cfgs[0].Logger, everyRoute: c.ReadyOnEveryRoute}
	for i, cfg := range cfgs {
		var sink sinks.Sink // the router has none
		switch {
		case i < len(c.Routes):
			sink = c.Routes[i].Sink
		case cfg.Route == UnroutedRoute:
			sink = noRoute{}
		}
		r, err := New(pool, sink, cfg)
		if err != nil {
			return nil, err
		}
		s.relays = append(s.relays, r)
	}
	return s, nil
}

// Plan returns the configuration of every relay a Set of c runs, in
// order: one per route, then the fan-out router's when some route fans
// out and shares topics with another, then the unrouted route's unless a
// route takes "*". It validates c (errors name the route by its index
// and the field) but not the sinks, and does no I/O.
func (c SetConfig) Plan() ([]Config, error) {
	if len(c.Routes) == 0 {
		return nil, errors.New("outbox: routes: at least one route is required")
	}
	base := c.Config.WithDefaults()
	if err := base.Validate(); err != nil {
		return nil, err
	}
	var out []Config
	var earlier, all []string
	seen := map[string]bool{}
	for i, rt := range c.Routes {
		cfg, err := c.routeConfig(base, i, earlier, seen)
		if err != nil {
			return nil, err
		}
		out = append(out, cfg)
		if !rt.FanOut {
			earlier = append(earlier, rt.Topics...)
		}
		all = append(all, rt.Topics...)
	}
	if router, ok := c.router(base, out); ok {
		out = append(out, router)
	}
	if !c.catchAll() {
		cfg := base
		cfg.Route, cfg.Topics, cfg.ExcludeTopics = UnroutedRoute, nil, all
		// What no route takes has no order to keep: a hold would keep
		// nothing back and only show as a held key.
		cfg.OnDeadLetter = OnDeadLetterSkip
		cfg.ID = base.ID + "/" + UnroutedRoute
		cfg.Workers = 1
		out = append(out, cfg)
	}
	for i := range out {
		// One Listen (Set.Run) wakes them all; alone, a relay listens itself.
		out[i].sharedListener = len(out) > 1
		if c.Hooks != nil {
			if h := c.Hooks(out[i].Route); h != nil {
				out[i].Hooks = h
			}
		}
	}
	return out, nil
}

// catchAll reports whether a route takes every topic ("*"): then no
// UnroutedRoute is added.
func (c SetConfig) catchAll() bool {
	for _, rt := range c.Routes {
		if slices.Contains(rt.Topics, "*") {
			return true
		}
	}
	return false
}

// routeConfig returns the relay configuration of route i, which takes
// what the earlier routes' patterns do not.
func (c SetConfig) routeConfig(base Config, i int, earlier []string, seen map[string]bool) (Config, error) {
	rt := c.Routes[i]
	field := fmt.Sprintf("routes[%d]", i)
	switch {
	case !routeName.MatchString(rt.Name):
		return Config{}, fmt.Errorf("outbox: %s.name: %q must be 1-63 lower-case letters, digits, '.', '_' or '-'", field, rt.Name)
	case seen[rt.Name]:
		return Config{}, fmt.Errorf("outbox: %s.name: %q used twice", field, rt.Name)
	case len(rt.Topics) == 0:
		return Config{}, fmt.Errorf("outbox: %s.topics: at least one topic pattern is required", field)
	case rt.Name == UnroutedRoute && !c.catchAll():
		// Two relays in one route would split its lanes, and the built-in
		// one would dead-letter this route's messages in its share.
		return Config{}, fmt.Errorf("outbox: %s.name: %q is the built-in route that dead-letters the topics no route matches: rename the route, or add a route for \"*\" (then there is no built-in one)", field, rt.Name)
	}
	seen[rt.Name] = true
	cfg := base
	if rt.Config != nil {
		cfg = rt.Config.WithDefaults()
	}
	// The producer names the outbox, which the routes share like the
	// schema: one name, whichever route a key's messages take.
	cfg.Schema, cfg.Producer, cfg.Route, cfg.Topics = base.Schema, base.Producer, rt.Name, rt.Topics
	cfg.ExcludeTopics, cfg.deliveries, cfg.fanOut, cfg.share = nil, false, nil, base.share
	if !rt.FanOut {
		cfg.ExcludeTopics = append([]string(nil), earlier...)
	}
	cfg.ID = base.ID + "/" + rt.Name
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", field, err)
	}
	return cfg, nil
}

// router turns the routes the fan-out router feeds into its destinations
// (rewriting their configurations in place) and returns the router's
// configuration; false when no route needs one.
func (c SetConfig) router(base Config, cfgs []Config) (Config, bool) {
	fed := c.Feeds()
	rcfg := base
	rcfg.Route, rcfg.ID = RouterRoute, base.ID+"/"+RouterRoute
	for i, f := range fed {
		if !f {
			continue
		}
		rc := &cfgs[i]
		rcfg.fanOut = append(rcfg.fanOut, fanOutDest{Route: rc.Route, Topics: rc.Topics, ExcludeTopics: rc.ExcludeTopics})
		rcfg.Topics = append(rcfg.Topics, rc.Topics...)
		rc.deliveries, rc.Topics, rc.ExcludeTopics = true, nil, nil
	}
	return rcfg, len(rcfg.fanOut) > 0
}

// Feeds reports, route by route, whether the route takes its messages
// from the fan-out router's copies: every route when IsolateRoutes holds
// and there are two or more; else the routes that may share a topic with
// a fan-out route.
func (c SetConfig) Feeds() []bool {
	fed := routerFeeds(c.Routes)
	if c.IsolateRoutes && len(c.Routes) > 1 {
		for i := range fed {
			fed[i] = true
		}
	}
	return fed
}

// routerFeeds reports, route by route, whether the route takes its
// messages from the fan-out router's copies  rather
// than from the outbox: fan-out routes that can share a topic with
// another route, ordinary routes that can share one with a fan-out route,
// and, spreading, ordinary routes that can share one with those, so that
// every message of a route takes one path and keeps its key order. It
// decides on the patterns alone (topic.Overlap). The other routes read
// the outbox directly, at no cost.
func routerFeeds(routes []Route) []bool {
	overlap := func(i, j int) bool {
		for _, a := range routes[i].Topics {
			for _, b := range routes[j].Topics {
				if topic.Overlap(a, b) {
					return true
				}
			}
		}
		return false
	}
	fed := make([]bool, len(routes))
	for i := range routes {
		for j := range routes {
			if i != j && (routes[i].FanOut || routes[j].FanOut) && overlap(i, j) {
				fed[i], fed[j] = true, true
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for i := range routes {
			for j := range routes {
				if fed[i] && !fed[j] && !routes[j].FanOut && !routes[i].FanOut && overlap(i, j) {
					fed[j], changed = true, true
				}
			}
		}
	}
	return fed
}

// Run runs every relay until ctx is cancelled, then drains them (see
// Relay.Run). A relay that fails stops the others: the process must not
// half-run. It returns every relay's error.
func (s *Set) Run(ctx context.Context) error {
	errs := make([]error, len(s.relays))
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(s.relays) > 1 {
		k, stopListen := listen(ctx, s.pool, s.cfgs[0], func(ls lanes.Set) {
			for _, r := range s.relays {
				r.wakeSet(ls)
			}
		}, s.membersNotified)
		defer stopListen()
		for _, r := range s.relays {
			r.waker = k
		}
	}
	for i, r := range s.relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = r.Run(ctx); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// membersNotified: relays joined or left, and every relay of the Set
// recomputes its share of the lanes; or lanes were handed back (freed),
// and those below their share take them.
func (s *Set) membersNotified(freed bool) {
	for _, r := range s.relays {
		r.lease.MembersNotified(freed)
	}
}

// Relays returns the Set's relays, in the order of Plan.
func (s *Set) Relays() []*Relay { return append([]*Relay(nil), s.relays...) }

// Live reports the first relay that is not live (see Relay.Live).
func (s *Set) Live() error {
	for _, r := range s.relays {
		if err := r.Live(); err != nil {
			return err
		}
	}
	return nil
}

// Ready reports whether the Set can do its job: every relay can claim
// (see Relay.Ready), and a route's destination is up (every route's with
// SetConfig.ReadyOnEveryRoute). The error names each route that is down.
func (s *Set) Ready(ctx context.Context) error {
	_, err := s.Readiness(ctx)
	return err
}

// Readiness is Ready, and when the Set is ready, the routes that are
// down or slowed (rate limited, messages failing), one a line ("" when
// none is).
func (s *Set) Readiness(ctx context.Context) (degraded string, err error) {
	var down, strained []error
	routes := 0
	for _, r := range s.relays {
		if err := r.readyToClaim(ctx); err != nil {
			return "", routeErr(r, err)
		}
		if _, ok := r.sink.(noRoute); ok || r.src.router() {
			continue // no destination of its own
		}
		routes++
		if err := r.destinationUp(ctx); err != nil {
			down = append(down, routeErr(r, err))
		} else if why := r.strained(); why != "" {
			strained = append(strained, routeErr(r, errors.New(why)))
		}
	}
	switch {
	case len(down) == 0 && len(strained) == 0:
		return "", nil
	case len(down) > 0 && (len(down) == routes || s.everyRoute):
		return "", errors.Join(down...)
	}
	return errors.Join(append(down, strained...)...).Error(), nil
}

// routeErr names r's route in err when the Set has several.
func routeErr(r *Relay, err error) error {
	if r.cfg.Route == "" {
		return err
	}
	return fmt.Errorf("route %s: %w", r.cfg.Route, err)
}

// noRoute is the unrouted route's sink: it refuses every message, as a
// permanent failure, so that it is dead-lettered at once.
type noRoute struct{}

func (noRoute) Send(_ context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	for i, m := range msgs {
		be.Errs[i] = sinks.Permanent(fmt.Errorf("no route matches topic %q", m.Topic))
	}
	return be.Err()
}

func (noRoute) Close(context.Context) error { return nil }
