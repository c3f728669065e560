// Package console is the operator console of a relay process: a JSON API
// under /api/v1 (status, dead letters, archive replay, its OpenAPI
// document) and a server-rendered web UI under /ui, both served on the
// admin listener.
//
// The actions themselves live in package relay/operator; this package
// only serves them: it parses selectors, checks tokens and origins, bounds
// request bodies and pages, writes the audit log, and renders the pages
// (html/template, assets embedded, no JavaScript needed to read or act).
// It starts no relay; the backlog samples behind the overview's charts
// come from a Sampler the relay process runs.
//
// A process that relays from several outboxes (Config.Sources) has a
// console for all of them: GET /api/v1/sources and the UI's summary list
// them, and every other request names the one it acts on in its source
// parameter. The calls on one outbox's data refuse a request that names
// none while there are several (400): an action on an outbox chosen for
// the caller could replay on the wrong tenant.
package console

import (
	"cmp"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// Config configures the console.
type Config struct {
	// Admin runs the operator actions. Required unless Sources is set.
	Admin *operator.Admin
	// Sources, when set, are the outboxes of a process that relays from
	// several (relay.Sources), in the order they are configured; Admin,
	// Routes and Samples are then unused: each source has its own.
	Sources []Source
	// Tokens are the bearer tokens mutations need. Default nil: every
	// mutation is refused with 403, saying how to enable them.
	Tokens *Tokens
	// ProtectReads makes every read (the API's GETs and the UI's pages)
	// need a token of Tokens, read-only or not. Default false: the status
	// and the pages that show no message are open to anyone who reaches
	// the admin listener.
	ProtectReads bool
	// OpenPayloads serves the reads that return messages' payloads and
	// headers (the dead letters, in the API and the UI) to anyone who
	// reaches the admin listener. Default false: they need a token of
	// Tokens, read-only or not, and without Tokens they are refused (403)
	// with what to set; a message's payload and headers are the
	// application's data, often personal, and the admin listener binds
	// every interface by default. It contradicts ProtectReads.
	OpenPayloads bool
	// Routes describe the routes this process serves, sinks redacted.
	// Default nil: the routes page lists none.
	Routes []Route
	// Samples holds the backlog history behind the overview's sparklines.
	// Default nil: no charts.
	Samples *Sampler
	// FailingAfter is how long messages of a topic or route may have been
	// failing before the overview shows a banner. Default 5 minutes.
	FailingAfter time.Duration
	// Relay says which process answers, on every page and in the status.
	// Default: this host's name and pid.
	Relay Identity
	// Logger receives the audit log (one line per mutation). Default
	// slog.Default().
	Logger *slog.Logger
}

// Source is one outbox of a multi-source process.
type Source struct {
	// Name names the source: 1-63 lower-case letters, digits, '.', '_'
	// or '-', unique among the sources. Requests name it in their
	// source parameter.
	Name string
	// Admin runs the operator actions on the source's outbox. Required.
	Admin *operator.Admin
	// Routes describe the source's routes, sinks redacted.
	Routes []Route
	// Samples holds the source's backlog history. Default nil: no charts.
	Samples *Sampler
	// State reports the source's state (relay.Sources.States); nil: not shown.
	State func() relay.SourceState
}

// Identity names the relay process that answers.
type Identity struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname"`
	PID      int    `json:"pid"`
	Version  string `json:"version"`
}

// Route is one route of the process as the console shows it.
type Route struct {
	Name   string   `json:"name"`
	Topics []string `json:"topics"`
	FanOut bool     `json:"fan_out"`
	// Sink is the sink's URL with its secrets redacted.
	Sink   string `json:"sink"`
	Format string `json:"format"`
	// Settings are other settings worth showing (workers, batch size...),
	// none of them secret.
	Settings map[string]string `json:"settings,omitempty"`
}

// DefaultFailingAfter is Config.FailingAfter's default.
const DefaultFailingAfter = 5 * time.Minute

// Limits of what a request may ask.
const (
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 64 << 10
	// MaxPageSize bounds a page of dead letters.
	MaxPageSize = 1000
	// MaxIDs bounds the ids of one selector.
	MaxIDs = 1000
)

// Console serves the API and the UI. It is an http.Handler for the paths
// /api/v1/... and /ui/...
type Console struct {
	cfg Config
	// srcs are the outboxes served: Config.Sources, or one unnamed source
	// of Config.Admin, Routes and Samples (single); byName finds a
	// source of Config.Sources by its name.
	srcs   []*Source
	byName map[string]*Source
	single *Source
	log    *slog.Logger
	mux    *http.ServeMux
	cop    *http.CrossOriginProtection
	tmpl   *templates
}

// New returns the console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.ProtectReads && cfg.Tokens == nil {
		return nil, errors.New("outbox: console: protecting reads needs tokens (--admin-token-file)")
	}
	if cfg.ProtectReads && cfg.OpenPayloads {
		return nil, errors.New("outbox: console: reads protected (--admin-read-token) and payloads open (--admin-open-payloads): give one of them")
	}
	if cfg.Relay.Hostname == "" {
		cfg.Relay.Hostname, _ = os.Hostname()
	}
	cfg.Relay.PID = cmp.Or(cfg.Relay.PID, os.Getpid())
	cfg.FailingAfter = cmp.Or(cfg.FailingAfter, DefaultFailingAfter)
	c := &Console{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), mux: http.NewServeMux()}
	if err := c.setSources(); err != nil {
		return nil, err
	}
	c.cop = http.NewCrossOriginProtection()
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, "cross-origin request refused: mutations must come from the console's own origin or from a client that sends no Origin header")
	}))
	t, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	c.tmpl = t
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := c.mux
	m.Handle("GET /api/v1/openapi.json", c.read(http.HandlerFunc(c.openAPI)))
	m.Handle("GET /api/v1/sources", c.read(http.HandlerFunc(c.apiSources)))
	m.Handle("GET /api/v1/status", c.read(c.scoped(c.apiStatus)))
	m.Handle("GET /api/v1/dead-letters", c.payloads(c.scoped(c.apiList)))
	m.Handle("GET /api/v1/dead-letters/{id}", c.payloads(c.scoped(c.apiShow)))
	m.Handle("POST /api/v1/dead-letters/replay", c.write(c.scopedWrite(c.apiReplay)))
	m.Handle("POST /api/v1/dead-letters/purge", c.write(c.scopedWrite(c.apiPurge)))
	m.Handle("POST /api/v1/archive/replay", c.write(c.scopedWrite(c.apiArchiveReplay)))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path+" (see /api/v1/openapi.json)")
	})

	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", staticFiles()))
	m.Handle("GET /ui/{$}", c.read(c.scoped(c.uiOverview)))
	m.Handle("GET /ui/dead-letters", c.payloads(c.scoped(c.uiDeadLetters)))
	m.Handle("GET /ui/dead-letters/{id}", c.payloads(c.scoped(c.uiDeadLetter)))
	m.Handle("GET /ui/confirm", c.read(c.scoped(c.uiConfirm)))
	m.Handle("POST /ui/dead-letters/{action}", c.cop.Handler(http.HandlerFunc(c.uiAct)))
	m.Handle("GET /ui/relays", c.read(c.scoped(c.uiRelays)))
	m.Handle("GET /ui/routes", c.read(c.scoped(c.uiRoutes)))
	m.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}

// ServeHTTP serves the API and the UI.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	c.mux.ServeHTTP(w, r)
}

// since is the age of t on the database's clock now (zero for a zero t).
func since(now, t time.Time) time.Duration {
	if t.IsZero() || t.After(now) {
		return 0
	}
	return now.Sub(t)
}
