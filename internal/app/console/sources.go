package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// sourceName is what a source's name may be (as relay.Sources requires).
var sourceName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// SourceTimeout bounds the counts of one source that GET /api/v1/sources
// and the UI's summary read: a source whose database does not answer in
// time is listed with the error, the others with their counts.
const SourceTimeout = 2 * time.Second

// setSources checks the configured outboxes: Config.Sources, or the one
// of Config.Admin.
func (c *Console) setSources() error {
	if len(c.cfg.Sources) == 0 {
		if c.cfg.Admin == nil {
			return errors.New("outbox: console: Admin is required (or Sources, for a process of several outboxes)")
		}
		c.single = &Source{Admin: c.cfg.Admin, Routes: c.cfg.Routes, Samples: c.cfg.Samples}
		c.srcs = []*Source{c.single}
		return nil
	}
	c.byName = map[string]*Source{}
	for i, s := range c.cfg.Sources {
		field := fmt.Sprintf("outbox: console: sources[%d]", i)
		switch {
		case !sourceName.MatchString(s.Name):
			return fmt.Errorf("%s.name: %q must be 1-63 lower-case letters, digits, '.', '_' or '-'", field, s.Name)
		case c.byName[s.Name] != nil:
			return fmt.Errorf("%s.name: %q used twice", field, s.Name)
		case s.Admin == nil:
			return fmt.Errorf("%s (%s): Admin is required", field, s.Name)
		}
		src := &Source{Name: s.Name, Admin: s.Admin, Routes: s.Routes, Samples: s.Samples, State: s.State}
		c.srcs = append(c.srcs, src)
		c.byName[s.Name] = src
	}
	return nil
}

// multi reports whether the console serves Config.Sources.
func (c *Console) multi() bool { return c.single == nil }

// names lists the sources' names, comma separated, in their order.
func (c *Console) names() string {
	names := make([]string, len(c.srcs))
	for i, s := range c.srcs {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

// pick returns the source named name. When it cannot, it returns nil with
// the status and the message to answer: 400 for no name while there are
// several sources (an action on the wrong outbox is an incident: none is
// chosen for the caller), 404 for an unknown name.
func (c *Console) pick(name string) (*Source, int, string) {
	if !c.multi() {
		return c.single, 0, ""
	}
	if name == "" {
		if len(c.srcs) == 1 {
			return c.srcs[0], 0, ""
		}
		return nil, http.StatusBadRequest, fmt.Sprintf("source: required: this process relays from several outboxes (%s); name one with the source parameter, e.g. ?source=%s",
			c.names(), c.srcs[0].Name)
	}
	if s := c.byName[name]; s != nil {
		return s, 0, ""
	}
	return nil, http.StatusNotFound, fmt.Sprintf("source: no source named %q; the sources are %s", name, c.names())
}

// sourceKey keys the source a request acts on in its context.
type sourceKey struct{}

// src returns the source the request acts on: the one resolve found, the
// only one of a single-outbox console, or nil (the UI's summary of all
// sources).
func (c *Console) src(r *http.Request) *Source {
	if s, ok := r.Context().Value(sourceKey{}).(*Source); ok {
		return s
	}
	return c.single
}

// resolve finds the source named name for r and returns r carrying it.
// When it cannot, it has answered the request (an error, or a page of the
// UI sent to the summary) and reports false. The UI's overview without a
// name, while Config.Sources is set, is the summary: r carries no source.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, name string) (*http.Request, bool) {
	if !c.multi() {
		return r, true
	}
	ui := strings.HasPrefix(r.URL.Path, "/ui")
	if name == "" && ui && r.Method == http.MethodGet && r.URL.Path == "/ui/" {
		return r, true
	}
	s, status, msg := c.pick(name)
	switch {
	case s != nil:
		return r.WithContext(context.WithValue(r.Context(), sourceKey{}, s)), true
	case status == http.StatusBadRequest && ui && r.Method == http.MethodGet:
		// A page of no source: the summary, to choose one.
		http.Redirect(w, r, "/ui/", http.StatusFound)
	default:
		c.fail(w, r, status, msg)
	}
	return r, false
}

// scoped wraps a read of one source: the source parameter of the query
// names it.
func (c *Console) scoped(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := c.resolve(w, r, r.URL.Query().Get("source")); ok {
			h(w, r)
		}
	})
}

// scopedWrite wraps an API mutation of one source: the source parameter
// of the query names it (the body is the action's).
func (c *Console) scopedWrite(h func(w http.ResponseWriter, r *http.Request, who string)) func(w http.ResponseWriter, r *http.Request, who string) {
	return func(w http.ResponseWriter, r *http.Request, who string) {
		if r, ok := c.resolve(w, r, r.URL.Query().Get("source")); ok {
			h(w, r, who)
		}
	}
}

// sourceAttrs are the log attributes naming r's source (none for a
// single-outbox console).
func (c *Console) sourceAttrs(r *http.Request) []any {
	if s := c.src(r); c.multi() && s != nil {
		return []any{"source", s.Name}
	}
	return nil
}

// sourceView is one source in GET /api/v1/sources and on the summary.
type sourceView struct {
	Name string `json:"name"`
	// State, Since, Restarts: from Source.State; absent without one.
	State    string     `json:"state,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Error    string     `json:"error,omitempty"`
	RetryAt  *time.Time `json:"retry_at,omitempty"`
	Restarts *int       `json:"restarts,omitempty"`
	// Counts are the source's totals, absent when its database did not
	// answer: CountsError says why.
	Counts      *operator.Backlog `json:"counts,omitempty"`
	CountsError string            `json:"counts_error,omitempty"`
}

// sourcesView is the answer of GET /api/v1/sources.
type sourcesView struct {
	AnsweredBy Identity     `json:"answered_by"`
	Sources    []sourceView `json:"sources"`
}

// stateOf lays out a source's state.
func stateOf(s *Source) sourceView {
	v := sourceView{Name: s.Name}
	if s.State == nil {
		return v
	}
	st := s.State()
	restarts := st.Restarts
	v.State, v.Restarts = st.State, &restarts
	if !st.Since.IsZero() {
		v.Since = &st.Since
	}
	if st.Err != nil {
		v.Error = st.Err.Error()
	}
	if st.State == relay.SourceDown && !st.Retry.IsZero() {
		v.RetryAt = &st.Retry
	}
	return v
}

// sourceViews reads every source's state and counts, the counts of all
// sources at once, each bounded by SourceTimeout.
func (c *Console) sourceViews(ctx context.Context) []sourceView {
	out := make([]sourceView, len(c.srcs))
	var wg sync.WaitGroup
	for i, s := range c.srcs {
		out[i] = stateOf(s)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, SourceTimeout)
			defer cancel()
			g, err := s.Admin.Gauges(ctx)
			switch {
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				out[i].CountsError = fmt.Sprintf("the database did not answer within %s: %v", SourceTimeout, err)
			case err != nil:
				out[i].CountsError = err.Error()
			default:
				out[i].Counts = &g.Backlog
			}
		})
	}
	wg.Wait()
	return out
}

func (c *Console) apiSources(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, sourcesView{AnsweredBy: c.cfg.Relay, Sources: c.sourceViews(r.Context())})
}

// summaryRow is a row of the UI's summary of all sources.
type summaryRow struct {
	sourceView
	Link         template.URL
	Badge, Class string
	For, Retry   string
	Oldest       string
}

// sourceBadges are the sources' states' badges and their classes.
var sourceBadges = map[string][2]string{
	relay.SourceStarting: {"starting", "limited"},
	relay.SourceRunning:  {"running", "ok"},
	relay.SourceDown:     {"down", "down"},
	relay.SourceStopped:  {"stopped", "degraded"},
}

// summaryRows lays out the sources for the summary, with a banner line for
// each source that is down.
func summaryRows(views []sourceView, now time.Time) ([]summaryRow, []string) {
	rows := make([]summaryRow, len(views))
	var banners []string
	for i, v := range views {
		row := summaryRow{sourceView: v, Link: template.URL("/ui/?" + url.Values{"source": {v.Name}}.Encode())}
		if b, ok := sourceBadges[v.State]; ok {
			row.Badge, row.Class = b[0], b[1]
		} else {
			row.Badge, row.Class = cmpOr(v.State, "—"), ""
		}
		if v.Since != nil {
			row.For = ago(now, *v.Since)
		}
		if v.RetryAt != nil {
			row.Retry = "due"
			if v.RetryAt.After(now) {
				row.Retry = "in " + age(v.RetryAt.Sub(now))
			}
		}
		if v.Counts != nil {
			row.Oldest = age(v.Counts.OldestAge)
		}
		if v.State == relay.SourceDown {
			line := fmt.Sprintf("Source %s down", v.Name)
			if row.For != "" {
				line += " since " + row.For
			}
			if v.Error != "" {
				line += ": " + oneLine(v.Error, 200)
			}
			if row.Retry != "" {
				line += "; next start " + row.Retry
			}
			banners = append(banners, line)
		}
		rows[i] = row
	}
	return rows, banners
}

// uiSummary is the UI's overview of a process of several sources: one
// row per source, each linking to its own overview.
func (c *Console) uiSummary(w http.ResponseWriter, r *http.Request) {
	rows, banners := summaryRows(c.sourceViews(r.Context()), time.Now())
	c.render(w, r, http.StatusOK, "sources", "Sources", struct {
		Sources []summaryRow
		Banners []string
	}{rows, banners})
}
