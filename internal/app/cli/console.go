package cli

import (
	"bytes"
	"cmp"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// loadTokens reads --admin-token-file. Unlike the *_FILE secrets, which
// are accepted with a warning, a token file others can read is refused:
// whoever reads it can replay and purge.
func loadTokens(o runOptions) (*console.Tokens, error) {
	if o.adminReadToken && o.adminOpenPay {
		return nil, usagef("outbox: admin-read-token, admin-open-payloads: the first makes every read need a token, the second serves the dead letters without one: give one of them")
	}
	if o.adminTokenFile == "" {
		if o.adminReadToken {
			return nil, usagef("outbox: admin-read-token: needs --admin-token-file (the tokens that may read)")
		}
		return nil, nil
	}
	b, fi, err := readRegularFile("admin-token-file", o.adminTokenFile, maxSecretFileBytes)
	if err != nil {
		return nil, err
	}
	if exposed(fi) {
		return nil, usagef("outbox: admin-token-file: %s is readable by other users (mode %s): chmod 600 it (in Kubernetes: defaultMode 0440 and the pod's fsGroup)",
			o.adminTokenFile, fi.Mode().Perm())
	}
	t, err := console.ParseTokens(bytes.NewReader(b))
	if err != nil {
		return nil, usagef("outbox: admin-token-file: %s: %v", o.adminTokenFile, err)
	}
	return t, nil
}

// newConsole builds the operator console of the admin listener and the
// sampler behind its charts (the caller runs it).
func newConsole(g *globals, pool *pgxpool.Pool, base relay.Config, o runOptions, tokens *console.Tokens,
	routes []route, planned []relay.Config) (*console.Console, *console.Sampler, error) {
	admin, err := operator.New(pool, g.schema)
	if err != nil {
		return nil, nil, &usageError{err}
	}
	sampler := console.NewSampler(admin, o.consoleSample, g.log)
	c, err := console.New(consoleConfig(g, base, o, tokens, console.Config{
		Admin:   admin,
		Routes:  consoleRoutes(routes, planned, o),
		Samples: sampler,
	}))
	if err != nil {
		return nil, nil, &usageError{err}
	}
	return c, sampler, nil
}

// sourcesConsole builds the console of a run with a sources list: a
// source each, with its own outbox and sampler.
func sourcesConsole(g *globals, parts []*sourceParts, states func() []relay.SourceState, base relay.Config, o runOptions,
	tokens *console.Tokens, routes []route, planned []relay.Config) (*console.Console, error) {
	shown := consoleRoutes(routes, planned, o)
	var sources []console.Source
	for _, p := range parts {
		sources = append(sources, console.Source{Name: p.name, Admin: p.admin, Routes: shown, Samples: p.sampler,
			State: func() relay.SourceState {
				for _, st := range states() {
					if st.Name == p.name {
						return st
					}
				}
				return relay.SourceState{Name: p.name}
			}})
	}
	c, err := console.New(consoleConfig(g, base, o, tokens, console.Config{Sources: sources}))
	if err != nil {
		return nil, &usageError{err}
	}
	return c, nil
}

// consoleConfig completes c with what every console of a run shares.
func consoleConfig(g *globals, base relay.Config, o runOptions, tokens *console.Tokens, c console.Config) console.Config {
	c.Tokens = tokens
	c.ProtectReads = o.adminReadToken
	c.OpenPayloads = o.adminOpenPay
	c.FailingAfter = o.consoleFailing
	c.Relay = console.Identity{ID: base.ID, Version: version()}
	c.Logger = g.log
	return c
}

// consoleRoutes describes the planned relays' routes for the console,
// sinks redacted.
func consoleRoutes(routes []route, planned []relay.Config, o runOptions) []console.Route {
	var shown []console.Route
	for _, cfg := range planned {
		rt := describe(routes, cfg.Route)
		cr := console.Route{Name: cfg.Route, Topics: cfg.Topics, FanOut: cfg.Router(), Sink: rt.sinkName,
			Format: cmp.Or(rt.format, o.format),
			Settings: map[string]string{
				"workers":      strconv.Itoa(cfg.Workers),
				"batch_size":   strconv.Itoa(cfg.BatchSize),
				"max_attempts": strconv.Itoa(cfg.MaxAttempts),
			}}
		if cr.Topics == nil {
			cr.Topics = []string{}
		}
		if rt.open == nil { // the built-in routes: no sink of their own
			cr.Format = ""
		}
		shown = append(shown, cr)
	}
	return shown
}
