package console_test

import (
	"errors"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// stateBox is a source's state as a test sets it.
type stateBox struct {
	mu sync.Mutex
	st relay.SourceState
}

func (s *stateBox) get() relay.SourceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *stateBox) set(st relay.SourceState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
}

// sourcesEnv is a console of two sources, a and b, two schemas of the
// test database: the embedded env is the server with a's schema, b is
// b's schema (its server unused).
type sourcesEnv struct {
	*env
	b              *env
	stateA, stateB *stateBox
}

// setupSources serves sources a and b, both running; extra are more
// sources after them.
func setupSources(t *testing.T, extra ...console.Source) *sourcesEnv {
	t.Helper()
	t.Parallel()
	poolA, schemaA := pgtest.Schema(t)
	poolB, schemaB := pgtest.Schema(t)
	adminA, err := operator.New(poolA, schemaA)
	require.NoError(t, err)
	adminB, err := operator.New(poolB, schemaB)
	require.NoError(t, err)
	tokens, err := console.ParseTokens(strings.NewReader("alice:" + adminToken + "\nviewer:" + readToken + ":read\n"))
	require.NoError(t, err)
	since := time.Now().Add(-time.Hour)
	stA := &stateBox{st: relay.SourceState{Name: "a", State: relay.SourceRunning, Since: since}}
	stB := &stateBox{st: relay.SourceState{Name: "b", State: relay.SourceRunning, Since: since, Restarts: 2}}
	audit := &testkit.SyncBuffer{}
	c, err := console.New(console.Config{
		Sources: append([]console.Source{
			{Name: "a", Admin: adminA, State: stA.get,
				Routes: []console.Route{{Name: "", Topics: []string{}, Sink: "https://hooks.example/tenant-a", Format: "raw"}}},
			{Name: "b", Admin: adminB, State: stB.get,
				Routes: []console.Route{{Name: "", Topics: []string{}, Sink: "https://hooks.example/tenant-b", Format: "raw"}}},
		}, extra...),
		Tokens: tokens,
		Relay:  console.Identity{ID: "test-relay", Version: "test"},
		Logger: slog.New(slog.NewJSONHandler(audit, nil)),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	a := &env{t: t, pool: poolA, schema: schemaA, srv: srv, audit: audit, router: openAPIRouter(t)}
	return &sourcesEnv{env: a, b: &env{t: t, pool: poolB, schema: schemaB}, stateA: stA, stateB: stB}
}

type listedSource struct {
	Name     string
	State    string
	Since    *time.Time
	Error    string
	RetryAt  *time.Time `json:"retry_at"`
	Restarts *int
	Counts   *struct {
		Pending     int64
		Retrying    int64
		DeadLetters int64 `json:"dead_letters"`
		OldestAge   int64 `json:"oldest_pending_age_ns"`
	}
	CountsError string `json:"counts_error"`
}

func (e *sourcesEnv) sources() []listedSource {
	e.t.Helper()
	r := e.do("GET", "/api/v1/sources", nil)
	require.Equal(e.t, 200, r.Status, string(r.Body))
	var out struct {
		AnsweredBy console.Identity `json:"answered_by"`
		Sources    []listedSource
	}
	r.json(e.t, &out)
	require.Equal(e.t, "test-relay", out.AnsweredBy.ID)
	return out.Sources
}

// GET /api/v1/sources lists every source, in order, with its state and
// its outbox's counts.
func TestSourcesList(t *testing.T) {
	e := setupSources(t)
	e.exec(`INSERT INTO {s}.messages (topic, key, payload, created_at) VALUES ('orders', 'a', 'x', now() - interval '5 minutes'), ('orders', 'b', 'y', now())`)
	e.deadLetters(1)
	e.b.deadLetters(3)

	list := e.sources()
	require.Len(t, list, 2)
	a, b := list[0], list[1]
	require.Equal(t, "a", a.Name)
	require.Equal(t, "running", a.State)
	require.NotNil(t, a.Since)
	require.Empty(t, a.Error)
	require.Nil(t, a.RetryAt, "no retry while running")
	require.NotNil(t, a.Counts, a.CountsError)
	require.EqualValues(t, 2, a.Counts.Pending)
	require.EqualValues(t, 1, a.Counts.DeadLetters)
	require.Greater(t, time.Duration(a.Counts.OldestAge), 4*time.Minute)
	require.Equal(t, "b", b.Name)
	require.Equal(t, 2, *b.Restarts)
	require.NotNil(t, b.Counts, b.CountsError)
	require.Zero(t, b.Counts.Pending)
	require.EqualValues(t, 3, b.Counts.DeadLetters)
}

// A process of one outbox lists it, unnamed and without a state.
func TestSourcesListOneOutbox(t *testing.T) {
	e := setup(t)
	e.deadLetters(2)
	r := e.do("GET", "/api/v1/sources", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	var out struct{ Sources []listedSource }
	r.json(t, &out)
	require.Len(t, out.Sources, 1)
	require.Empty(t, out.Sources[0].Name)
	require.Empty(t, out.Sources[0].State)
	require.Nil(t, out.Sources[0].Restarts)
	require.EqualValues(t, 2, out.Sources[0].Counts.DeadLetters)
}

// A source whose database does not answer is listed with the error; the
// others keep their counts.
func TestSourcesListOneFailing(t *testing.T) {
	pool := pgtest.Pool(t)
	missing, err := operator.New(pool, pgtest.SchemaName(t)) // never created
	require.NoError(t, err)
	e := setupSources(t, console.Source{Name: "c", Admin: missing})
	e.b.deadLetters(1)
	list := e.sources()
	require.Len(t, list, 3)
	require.NotNil(t, list[1].Counts)
	require.EqualValues(t, 1, list[1].Counts.DeadLetters)
	c := list[2]
	require.Equal(t, "c", c.Name)
	require.Nil(t, c.Counts)
	require.NotEmpty(t, c.CountsError)
	require.Empty(t, c.State, "no State: not shown")

	html := string(e.do("GET", "/ui/", nil).Body)
	require.Regexp(t, `<tr data-source="c">.*counts unavailable: `, html)
}

// A dead-letter replay names its source: ?source=b touches b's dead
// letters only, and its audit line names b.
func TestSourcesReplayActsOnItsSource(t *testing.T) {
	e := setupSources(t)
	e.deadLetters(2)
	e.b.deadLetters(3)
	r := e.do("POST", "/api/v1/dead-letters/replay?source=b", `{"all":true}`, bearer(adminToken)...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var rep struct{ Count int }
	r.json(t, &rep)
	require.Equal(t, 3, rep.Count)
	require.Zero(t, e.b.count("dead_letters"))
	require.Equal(t, 3, e.b.count("messages"))
	require.Equal(t, 2, e.count("dead_letters"), "a's dead letters stay")
	require.Zero(t, e.count("messages"))
	require.Contains(t, e.audit.String(), `"source":"b","action":"replay","token":"alice"`)

	r = e.do("GET", "/api/v1/dead-letters?source=a", nil, bearer(readToken)...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var p struct {
		DeadLetters []operator.DeadLetter `json:"dead_letters"`
	}
	r.json(t, &p)
	require.Len(t, p.DeadLetters, 2)
	r = e.do("GET", "/api/v1/status?source=b", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	var st struct {
		Pending int64
		Routes  []console.Route
	}
	r.json(t, &st)
	require.EqualValues(t, 3, st.Pending)
	require.Equal(t, "https://hooks.example/tenant-b", st.Routes[0].Sink, "the source's own routes")
}

// Without a source, the calls on one outbox are refused (400, listing the
// sources) and change nothing; an unknown source is a 404 naming the
// known ones.
func TestSourcesRequired(t *testing.T) {
	e := setupSources(t)
	e.deadLetters(1)
	e.b.deadLetters(1)
	auth := bearer(adminToken)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/v1/dead-letters/replay", `{"all":true}`},
		{"POST", "/api/v1/dead-letters/purge", `{"all":true}`},
		{"POST", "/api/v1/archive/replay", `{"from_ago":"1h"}`},
		{"GET", "/api/v1/status", ""},
		{"GET", "/api/v1/dead-letters", ""},
		{"GET", "/api/v1/dead-letters/1", ""},
	} {
		var body any
		if c.body != "" {
			body = c.body
		}
		r := e.do(c.method, c.path, body, auth...)
		require.Equal(t, 400, r.Status, "%s %s: %s", c.method, c.path, r.Body)
		msg := r.errorMessage(t)
		require.Contains(t, msg, "source: required", c.path)
		require.Contains(t, msg, "(a, b)", c.path)

		r = e.do(c.method, c.path+"?source=z", body, auth...)
		require.Equal(t, 404, r.Status, "%s %s: %s", c.method, c.path, r.Body)
		require.Contains(t, r.errorMessage(t), `no source named "z"; the sources are a, b`, c.path)
	}
	r := e.form("/ui/dead-letters/purge", url.Values{"all": {"true"}, "token": {adminToken}})
	require.Equal(t, 400, r.Status, "the UI's form too")
	require.Contains(t, string(r.Body), "source: required")
	r = e.form("/ui/dead-letters/purge", url.Values{"all": {"true"}, "token": {adminToken}, "source": {"z"}})
	require.Equal(t, 404, r.Status)
	require.Contains(t, string(r.Body), "the sources are a, b")
	r = e.do("GET", "/ui/relays?source=z", nil)
	require.Equal(t, 404, r.Status)
	require.Contains(t, string(r.Body), `no source named &#34;z&#34;`)

	require.Equal(t, 1, e.count("dead_letters"))
	require.Equal(t, 1, e.b.count("dead_letters"))
	require.Zero(t, e.count("messages")+e.b.count("messages"))
	require.NotContains(t, e.audit.String(), `"action"`, "nothing ran, nothing to audit")
}

// The overview without a source is the summary of all sources, each
// linking to its own overview; a source's pages keep the source in their
// links and forms, and say which source they are about.
func TestSourcesUI(t *testing.T) {
	e := setupSources(t)
	e.deadLetters(1)
	e.b.deadLetters(2)
	page := func(path string) string {
		t.Helper()
		r := e.do("GET", path, nil, basic(readToken)...)
		require.Equal(t, 200, r.Status, "%s: %s", path, r.Body)
		return string(r.Body)
	}
	home := page("/ui/")
	require.Contains(t, home, `id="sources"`)
	require.Regexp(t, `<tr data-source="a"><td class="nowrap"><a href="/ui/\?source=a">a</a></td><td class="nowrap"><span class="badge ok">running</span>`, home)
	require.Regexp(t, `<tr data-source="b">.*<td>2</td><td>0</td><td>0</td><td class="alert">2</td>`, home, "b: 2 restarts, no pending, 2 dead letters")
	require.Contains(t, home, `<span class="source" id="source">all sources</span>`)
	require.NotContains(t, home, `id="banner"`, "every source runs")

	b := page("/ui/?source=b")
	require.Contains(t, b, `source <strong>b</strong> · <a href="/ui/" id="all-sources">all sources</a>`)
	require.Contains(t, b, `href="/ui/dead-letters?source=b"`)
	require.Contains(t, b, `href="/ui/relays?source=b"`)
	require.Contains(t, b, `href="/ui/?refresh=10&amp;source=b"`)
	require.Contains(t, b, `href="/ui/dead-letters?topic=orders&amp;source=b"`)

	list := page("/ui/dead-letters?source=b")
	require.Contains(t, list, `<input type="hidden" name="source" value="b">`, "the filter stays in b")
	require.Contains(t, list, `href="/ui/dead-letters/2?source=b"`)
	require.Contains(t, list, `href="/ui/confirm?action=replay&amp;all=true&amp;source=b"`)
	require.Contains(t, page("/ui/dead-letters/1?source=b"), `href="/ui/confirm?action=replay&amp;id=1&amp;source=b"`)
	require.Contains(t, page("/ui/routes?source=b"), "https://hooks.example/tenant-b")
	confirm := page("/ui/confirm?action=replay&all=true&source=b")
	require.Contains(t, confirm, "<strong>2</strong> dead letters to replay")
	require.Contains(t, confirm, `<input type="hidden" name="source" value="b">`)

	r := e.form("/ui/dead-letters/replay", url.Values{"all": {"true"}, "token": {adminToken}, "source": {"b"}})
	require.Equal(t, 200, r.Status, string(r.Body))
	require.Contains(t, string(r.Body), "Replayed <strong>2</strong> dead letters")
	require.Contains(t, string(r.Body), `href="/ui/dead-letters?source=b"`)
	require.Zero(t, e.b.count("dead_letters"))
	require.Equal(t, 1, e.count("dead_letters"), "a's dead letter stays")
	require.Contains(t, e.audit.String(), `"source":"b","action":"replay"`)

	// A page of no source sends the browser to the summary.
	require.Contains(t, page("/ui/dead-letters"), `id="sources"`)
}

// A source that is down shows on the summary, highlighted, with its error
// and its next start, and in GET /api/v1/sources.
func TestSourcesDown(t *testing.T) {
	e := setupSources(t)
	e.stateB.set(relay.SourceState{Name: "b", State: relay.SourceDown, Since: time.Now().Add(-90 * time.Second),
		Err: errors.New("outbox: connect: dial tcp 10.0.0.9:5432: connection refused"), Retry: time.Now().Add(time.Hour), Restarts: 3})
	home := string(e.do("GET", "/ui/", nil).Body)
	require.Regexp(t, `<tr data-source="b" class="alert">.*<span class="badge down">down</span>.*connection refused <span class="muted">\(next start in (59m\d\ds|1h00m)\)</span>`, home)
	require.Regexp(t, `id="banner"[^>]*><p>Source b down since 1m3\ds ago: outbox: connect: dial tcp 10.0.0.9:5432: connection refused; next start in`, home)
	require.NotContains(t, home, "Source a down")

	list := e.sources()
	b := list[1]
	require.Equal(t, "down", b.State)
	require.Contains(t, b.Error, "connection refused")
	require.NotNil(t, b.RetryAt)
	require.Equal(t, 3, *b.Restarts)
	require.NotNil(t, b.Counts, "its database answers: the relays' outage is not the database's")
	require.Empty(t, list[0].Error)
}

func TestNewChecksSources(t *testing.T) {
	t.Parallel()
	admin := &operator.Admin{}
	for want, srcs := range map[string][]console.Source{
		`sources[0].name: "" must be`:       {{Admin: admin}},
		`sources[1].name: "B" must be`:      {{Name: "a", Admin: admin}, {Name: "B", Admin: admin}},
		`sources[1].name: "a" used twice`:   {{Name: "a", Admin: admin}, {Name: "a", Admin: admin}},
		`sources[0] (a): Admin is required`: {{Name: "a"}},
	} {
		_, err := console.New(console.Config{Sources: srcs})
		require.ErrorContains(t, err, want)
	}
	_, err := console.New(console.Config{Sources: []console.Source{{Name: "tenant-1.eu_west", Admin: admin}}})
	require.NoError(t, err)
}
