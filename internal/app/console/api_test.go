package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

const (
	adminToken = "admin-secret-0123456789"
	readToken  = "reader-secret-0123456789"
)

// env is a console on a fresh schema, served by an httptest server, with
// its audit log captured and every answer checked against the OpenAPI
// document.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	srv    *httptest.Server
	audit  *testkit.SyncBuffer
	router routers.Router
}

type option func(*console.Config)

func noTokens(c *console.Config)     { c.Tokens = nil }
func protectReads(c *console.Config) { c.ProtectReads = true }
func openPayloads(c *console.Config) { c.OpenPayloads = true }

func setup(t *testing.T, opts ...option) *env {
	t.Helper()
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	admin, err := operator.New(pool, schema)
	require.NoError(t, err)
	tokens, err := console.ParseTokens(strings.NewReader("# operators\nalice:" + adminToken + "\nviewer:" + readToken + ":read\n"))
	require.NoError(t, err)
	audit := &testkit.SyncBuffer{}
	cfg := console.Config{
		Admin:  admin,
		Tokens: tokens,
		Routes: []console.Route{{Name: "", Topics: []string{}, Sink: "https://hooks.example/x?secret=xxxxx", Format: "raw"}},
		Relay:  console.Identity{ID: "test-relay", Version: "test"},
		Logger: slog.New(slog.NewJSONHandler(audit, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return &env{t: t, pool: pool, schema: schema, srv: srv, audit: audit, router: openAPIRouter(t)}
}

func openAPIRouter(t *testing.T) routers.Router {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(console.OpenAPI())
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	require.NoError(t, err)
	return r
}

// exec runs sql with {s} standing for the quoted schema.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), strings.ReplaceAll(sql, "{s}", migrations.Ident(e.schema)), args...)
	require.NoError(e.t, err)
}

func (e *env) count(table string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+migrations.Ident(e.schema)+"."+table).Scan(&n))
	return n
}

// deadLetters writes dead letters 1..n: topic orders (odd) or billing
// (even), key k<id%3>, reason permanent for multiples of 3 else
// max_attempts, dead id hours ago.
func (e *env) deadLetters(n int) {
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, route, dead_at, last_error)
SELECT i, gen_random_uuid(), CASE WHEN i % 2 = 1 THEN 'orders' ELSE 'billing' END, 'k' || (i % 3), convert_to('{"order":' || i || '}', 'UTF8'),
       '{"type":"OrderPlaced"}', now(), 5, CASE WHEN i % 3 = 0 THEN 'permanent' ELSE 'max_attempts' END, '', now() - i * interval '1 hour', 'HTTP 400: no'
FROM generate_series(1, $1) i`, n)
}

type resp struct {
	Status int
	Body   []byte
	Header http.Header
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.Body, v), string(r.Body))
}

func (r resp) errorMessage(t *testing.T) string {
	t.Helper()
	var e struct{ Error string }
	r.json(t, &e)
	require.NotEmpty(t, e.Error, "errors are JSON with a message")
	return e.Error
}

// do sends a request and, for the API, validates the answer against the
// OpenAPI document.
func (e *env) do(method, path string, body any, header ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		require.NoError(e.t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	require.NoError(e.t, err)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	out := resp{Status: res.StatusCode, Body: b, Header: res.Header}
	if strings.HasPrefix(path, "/api/v1/") {
		e.validate(req, out)
	}
	return out
}

func (e *env) validate(req *http.Request, r resp) {
	e.t.Helper()
	vreq := req.Clone(context.Background())
	vreq.URL.Host, vreq.URL.Scheme, vreq.Host = "", "", ""
	route, params, err := e.router.FindRoute(vreq)
	if err != nil && r.Status == http.StatusNotFound {
		return // an unknown endpoint: only its JSON error is checked
	}
	require.NoError(e.t, err, "%s %s is in the OpenAPI document", req.Method, req.URL.Path)
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}},
		Status: r.Status, Header: r.Header, Body: io.NopCloser(bytes.NewReader(r.Body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	})
	require.NoError(e.t, err, "%s %s answered %d %s, not as the OpenAPI document says", req.Method, req.URL.Path, r.Status, r.Body)
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// basic is what a browser sends once its user typed tok as the password
// of the UI's Basic challenge (the user name is ignored).
func basic(tok string) []string {
	return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("operator:"+tok))}
}

func TestStatus(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.messages (topic, key, payload, created_at) VALUES
    ('orders', 'a', 'x', now() - interval '5 minutes'), ('orders', 'b', 'y', now()), ('billing', NULL, 'z', now())`)
	e.exec(`UPDATE {s}.messages SET attempts = 2, available_at = now() + interval '1 minute', last_error = 'HTTP 503: maintenance',
    first_failed_at = now() - interval '3 minutes' WHERE topic = 'billing'`)
	e.deadLetters(3)
	r := e.do("GET", "/api/v1/status", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	var st struct {
		AnsweredBy console.Identity `json:"answered_by"`
		Pending    int64
		Topics     []struct {
			Topic            string
			Pending          int64
			OldestPendingAge int64 `json:"oldest_pending_age_ns"`
		}
		DeadByReason []struct {
			Reason string
			Count  int64
		} `json:"dead_letters_by_reason"`
		Routes      []console.Route
		RetryErrors []struct {
			Topic, Route, Error string
			Count               int64
			FirstSeen           time.Time `json:"first_seen_at"`
			Example             string    `json:"example_message_id"`
		} `json:"retry_errors"`
	}
	r.json(t, &st)
	// Issue 34: why messages retry.
	require.Len(t, st.RetryErrors, 1)
	require.Equal(t, "billing", st.RetryErrors[0].Topic)
	require.Equal(t, "HTTP 503: maintenance", st.RetryErrors[0].Error)
	require.EqualValues(t, 1, st.RetryErrors[0].Count)
	require.NotEmpty(t, st.RetryErrors[0].Example)
	require.False(t, st.RetryErrors[0].FirstSeen.IsZero())
	require.Equal(t, "test-relay", st.AnsweredBy.ID)
	require.NotZero(t, st.AnsweredBy.PID)
	require.EqualValues(t, 3, st.Pending)
	require.Len(t, st.Topics, 2)
	for _, tp := range st.Topics {
		if tp.Topic == "orders" {
			require.EqualValues(t, 2, tp.Pending)
			require.Greater(t, time.Duration(tp.OldestPendingAge), 4*time.Minute)
		}
	}
	require.NotEmpty(t, st.DeadByReason)
	require.Len(t, st.Routes, 1)
	require.Equal(t, "no-store", r.Header.Get("Cache-Control"))
}

func TestListFiltersAndPages(t *testing.T) {
	e := setup(t)
	e.deadLetters(9)
	ids := func(q string) []int64 {
		t.Helper()
		r := e.do("GET", "/api/v1/dead-letters?"+q, nil, bearer(readToken)...)
		require.Equal(t, 200, r.Status, string(r.Body))
		var p struct {
			DeadLetters []operator.DeadLetter `json:"dead_letters"`
		}
		r.json(t, &p)
		var out []int64
		for _, d := range p.DeadLetters {
			out = append(out, d.ID)
		}
		return out
	}
	require.Equal(t, []int64{1, 3, 5, 7, 9}, ids("topic=orders"))
	require.Equal(t, []int64{1, 4, 7}, ids("key=k1"))
	require.Equal(t, []int64{3, 6, 9}, ids("reason=permanent"))
	require.Equal(t, []int64{3, 9}, ids("reason=permanent&topic=orders"))
	now := time.Now().UTC()
	after := url.QueryEscape(now.Add(-3*time.Hour - 30*time.Minute).Format(time.RFC3339))
	before := url.QueryEscape(now.Add(-1*time.Hour - 30*time.Minute).Format(time.RFC3339))
	require.Equal(t, []int64{1, 2, 3}, ids("dead_after="+after))
	require.Equal(t, []int64{2, 3}, ids("dead_after="+after+"&dead_before="+before))
	require.Equal(t, []int64{2, 5}, ids("id=2,5"))
	require.Empty(t, ids("route=hook"))

	// Pages of 4 by cursor: 1-4, 5-8, 9.
	var all []int64
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		r := e.do("GET", "/api/v1/dead-letters?limit=4&cursor="+cursor, nil, bearer(readToken)...)
		require.Equal(t, 200, r.Status, string(r.Body))
		var p struct {
			DeadLetters []operator.DeadLetter `json:"dead_letters"`
			NextCursor  string                `json:"next_cursor"`
		}
		r.json(t, &p)
		for _, d := range p.DeadLetters {
			all = append(all, d.ID)
		}
		if p.NextCursor == "" {
			break
		}
		cursor = url.QueryEscape(p.NextCursor)
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, all)

	for q, want := range map[string]string{
		"limit=0":               "limit",
		"limit=1001":            "limit",
		"limit=many":            "limit",
		"cursor=%21%21":         "cursor",
		"dead_after=yesterday":  "dead_after",
		"dead_before=2026-13-1": "dead_before",
		"id=-3":                 "id",
		"older_than=soon":       "older_than",
	} {
		r := e.do("GET", "/api/v1/dead-letters?"+q, nil, bearer(readToken)...)
		require.Equal(t, 400, r.Status, q)
		require.Contains(t, r.errorMessage(t), want, q)
	}
}

func TestShow(t *testing.T) {
	e := setup(t)
	e.deadLetters(2)
	r := e.do("GET", "/api/v1/dead-letters/2", nil, bearer(readToken)...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var s struct {
		ID          int64
		DeadLetters []operator.DeadLetter `json:"dead_letters"`
	}
	r.json(t, &s)
	require.Len(t, s.DeadLetters, 1)
	require.Equal(t, `{"order":2}`, string(s.DeadLetters[0].Payload))
	require.Equal(t, "OrderPlaced", s.DeadLetters[0].Headers["type"])

	r = e.do("GET", "/api/v1/dead-letters/99", nil, bearer(readToken)...)
	require.Equal(t, 404, r.Status)
	require.Contains(t, r.errorMessage(t), "no such dead letter")
	r = e.do("GET", "/api/v1/dead-letters/x", nil, bearer(readToken)...)
	require.Equal(t, 400, r.Status)
	require.Contains(t, r.errorMessage(t), "id")
}

func TestMutationsWithoutTokensAreDisabled(t *testing.T) {
	e := setup(t, noTokens)
	e.deadLetters(1)
	for _, path := range []string{"/api/v1/dead-letters/replay", "/api/v1/dead-letters/purge", "/api/v1/archive/replay"} {
		r := e.do("POST", path, `{"all":true}`, bearer(adminToken)...)
		require.Equal(t, 403, r.Status, path)
		require.Contains(t, r.errorMessage(t), "--admin-token-file", "says how to enable them")
	}
	require.Equal(t, 1, e.count("dead_letters"))
	// The status stays open; the dead letters, payloads and headers, are
	// refused without tokens (TestDeadLettersNeedATokenByDefault).
	require.Equal(t, 200, e.do("GET", "/api/v1/status", nil).Status)
}

func TestMutationAuth(t *testing.T) {
	e := setup(t)
	e.deadLetters(1)
	cases := []struct {
		name   string
		header []string
		status int
		want   string
	}{
		{"no token", nil, 401, "Bearer"},
		{"wrong token", bearer("not-the-token-0123456789"), 401, "not one of"},
		{"prefix of the token", bearer(adminToken[:len(adminToken)-1]), 401, "not one of"},
		{"basic auth", []string{"Authorization", "Basic " + "YTphZG1pbi1zZWNyZXQtMDEyMzQ1Njc4OQ=="}, 401, "Bearer"},
		{"read-only token", bearer(readToken), 403, `"viewer" may only read`},
		{"another origin", append(bearer(adminToken), "Origin", "https://evil.example"), 403, "cross-origin"},
		{"a cross-site fetch", append(bearer(adminToken), "Sec-Fetch-Site", "cross-site"), 403, "cross-origin"},
	}
	for _, c := range cases {
		r := e.do("POST", "/api/v1/dead-letters/purge", `{"all":true}`, c.header...)
		require.Equal(t, c.status, r.Status, c.name)
		require.Contains(t, r.errorMessage(t), c.want, c.name)
		if c.status == 401 {
			require.NotEmpty(t, r.Header.Get("WWW-Authenticate"), c.name)
		}
	}
	require.Equal(t, 1, e.count("dead_letters"), "no refused request purged")
	require.NotContains(t, e.audit.String(), `"action":"purge"`, "refused requests do nothing to audit")

	// The same origin is fine, and so is a client that sends none.
	r := e.do("POST", "/api/v1/dead-letters/purge", `{"all":true,"dry_run":true}`, append(bearer(adminToken), "Origin", e.srv.URL)...)
	require.Equal(t, 200, r.Status, string(r.Body))
}

func TestReplayAndPurge(t *testing.T) {
	e := setup(t)
	e.deadLetters(6)
	auth := bearer(adminToken)

	r := e.do("POST", "/api/v1/dead-letters/replay", map[string]any{"topic": "orders", "dry_run": true}, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var rep struct {
		DryRun      bool `json:"dry_run"`
		Count       int
		Skipped     int
		DeadLetters []operator.ReplayedDeadLetter `json:"dead_letters"`
	}
	r.json(t, &rep)
	require.True(t, rep.DryRun)
	require.Equal(t, 3, rep.Count)
	require.Equal(t, 6, e.count("dead_letters"), "a dry run changes nothing")
	require.Zero(t, e.count("messages"))

	r = e.do("POST", "/api/v1/dead-letters/replay", map[string]any{"topic": "orders", "key": "k1"}, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &rep)
	require.False(t, rep.DryRun)
	require.Equal(t, 1, rep.Count, "orders (odd ids) of key k1 (id %% 3 = 1): 1")
	require.Equal(t, 1, e.count("messages"))

	r = e.do("POST", "/api/v1/dead-letters/purge", map[string]any{"reason": "permanent", "dry_run": true}, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var cnt struct {
		DryRun bool `json:"dry_run"`
		Count  int64
	}
	r.json(t, &cnt)
	require.Equal(t, int64(2), cnt.Count)
	r = e.do("POST", "/api/v1/dead-letters/purge", map[string]any{"reason": "permanent"}, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &cnt)
	require.Equal(t, int64(2), cnt.Count)
	require.Equal(t, 3, e.count("dead_letters"))

	// Every mutation, dry run or not, has its audit line.
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(e.audit.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		if m["msg"] == "console audit" {
			lines = append(lines, m)
		}
	}
	require.Len(t, lines, 4)
	require.Equal(t, "alice", lines[0]["token"])
	require.Equal(t, "replay", lines[0]["action"])
	require.Equal(t, true, lines[0]["dry_run"])
	require.EqualValues(t, 3, lines[0]["count"])
	require.JSONEq(t, `{"topic":"orders"}`, lines[0]["selector"].(string))
	require.Equal(t, "purge", lines[3]["action"])
	require.Equal(t, false, lines[3]["dry_run"])
	require.EqualValues(t, 2, lines[3]["count"])
	require.NotContains(t, e.audit.String(), adminToken, "no secret in the log")
}

func TestBadSelectorsAndBodies(t *testing.T) {
	e := setup(t)
	e.deadLetters(2)
	auth := bearer(adminToken)
	cases := []struct {
		path, body string
		status     int
		want       string
	}{
		{"/api/v1/dead-letters/replay", `{}`, 400, "select dead letters"},
		{"/api/v1/dead-letters/purge", `{"dry_run":true}`, 400, "select dead letters"},
		{"/api/v1/dead-letters/purge", `{"topik":"orders"}`, 400, `unknown field "topik"`},
		{"/api/v1/dead-letters/purge", `{"ids":[0]}`, 400, "ids"},
		{"/api/v1/dead-letters/purge", `{"reason":"bogus"}`, 400, `unknown dead-letter reason "bogus": the reasons are max_attempts, permanent`},
		{"/api/v1/dead-letters/replay", `{"reason":"bogus","dry_run":true}`, 400, "the reasons are max_attempts, permanent"},
		{"/api/v1/dead-letters/purge", `{"older_than":"a while"}`, 400, "older_than"},
		{"/api/v1/dead-letters/purge", `{"dead_after":"monday"}`, 400, "body"},
		{"/api/v1/dead-letters/purge", `{"all":true}{"all":true}`, 400, "more than one"},
		{"/api/v1/dead-letters/purge", `{"all":`, 400, "body"},
		{"/api/v1/dead-letters/purge", `{"topic":"` + strings.Repeat("x", console.MaxBodyBytes) + `"}`, 413, "over 65536 bytes"},
		{"/api/v1/dead-letters/replay", `{"ids":[` + strings.Repeat("1,", console.MaxIDs) + `1]}`, 400, "ids: at most"},
		{"/api/v1/archive/replay", `{"topic":"orders"}`, 400, "from or from_ago"},
		{"/api/v1/archive/replay", `{"from_ago":"-1h"}`, 400, "from_ago"},
		{"/api/v1/archive/replay", `{"from_ago":"1h","to_route_only":true}`, 400, "route"},
	}
	for _, c := range cases {
		r := e.do("POST", c.path, c.body, auth...)
		require.Equal(t, c.status, r.Status, "%s %.80s: %s", c.path, c.body, r.Body)
		require.Contains(t, r.errorMessage(t), c.want, c.body)
	}
	require.Equal(t, 2, e.count("dead_letters"))
	r := e.do("GET", "/api/v1/nothing", nil)
	require.Equal(t, 404, r.Status)
	require.Contains(t, r.errorMessage(t), "openapi.json")
}

// The list refuses an unknown reason too, rather than listing nothing.
func TestListRefusesUnknownReason(t *testing.T) {
	e := setup(t)
	e.deadLetters(2)
	r := e.do("GET", "/api/v1/dead-letters?reason=bogus", nil, bearer(readToken)...)
	require.Equal(t, 400, r.Status, string(r.Body))
	require.Contains(t, r.errorMessage(t), "the reasons are max_attempts, permanent")
	r = e.do("GET", "/api/v1/dead-letters?reason=permanent", nil, bearer(readToken)...)
	require.Equal(t, 200, r.Status, string(r.Body))
}

// {"route":""} names the default route (the outbox's own dead letters),
// not an empty selector; a named route still selects its copies only.
func TestDefaultRouteSelector(t *testing.T) {
	e := setup(t)
	e.deadLetters(3) // route ''
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, route, dead_at)
SELECT id, message_id, topic, key, payload, headers, created_at, attempts, reason, 'hook', dead_at FROM {s}.dead_letters`)
	auth := bearer(adminToken)
	var cnt struct{ Count int64 }
	r := e.do("POST", "/api/v1/dead-letters/purge", `{"route":"","dry_run":true}`, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &cnt)
	require.Equal(t, int64(3), cnt.Count, "the default route's three, not the copies")
	r = e.do("POST", "/api/v1/dead-letters/purge", `{"route":"hook","reason":"max_attempts","dry_run":true}`, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &cnt)
	require.Equal(t, int64(2), cnt.Count)
	r = e.do("POST", "/api/v1/dead-letters/purge", `{"route":""}`, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &cnt)
	require.Equal(t, int64(3), cnt.Count)
	var left []string
	rows, err := e.pool.Query(context.Background(), "SELECT DISTINCT route FROM "+migrations.Ident(e.schema)+".dead_letters")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		left = append(left, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"hook"}, left)
}

// Replays racing on the same dead letters publish each exactly once.
func TestConcurrentReplays(t *testing.T) {
	e := setup(t)
	const n, racers = 60, 6
	e.deadLetters(n)
	counts := make([]int, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			r := e.do("POST", "/api/v1/dead-letters/replay", `{"all":true}`, bearer(adminToken)...)
			require.Equal(t, 200, r.Status, string(r.Body))
			var rep struct{ Count int }
			r.json(t, &rep)
			counts[i] = rep.Count
		})
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	require.Equal(t, n, total, "each dead letter replayed once over all racers: %v", counts)
	require.Equal(t, n, e.count("messages"))
	require.Zero(t, e.count("dead_letters"))
}

func TestArchiveReplay(t *testing.T) {
	e := setup(t)
	e.exec(`CREATE TABLE {s}.archive_all PARTITION OF {s}.archive DEFAULT`)
	e.exec(`INSERT INTO {s}.archive (id, message_id, topic, key, payload, headers, created_at, delivered_at)
SELECT i, gen_random_uuid(), 'orders', 'k', 'x', '{}', now() - interval '1 hour', now() FROM generate_series(1, 4) i`)
	auth := bearer(adminToken)
	r := e.do("POST", "/api/v1/archive/replay", `{"from_ago":"2h","dry_run":true}`, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var cnt struct{ Count int64 }
	r.json(t, &cnt)
	require.EqualValues(t, 4, cnt.Count)
	require.Zero(t, e.count("messages"))
	r = e.do("POST", "/api/v1/archive/replay", `{"from":"`+time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339)+`","topic":"orders"}`, auth...)
	require.Equal(t, 200, r.Status, string(r.Body))
	r.json(t, &cnt)
	require.EqualValues(t, 4, cnt.Count)
	require.Equal(t, 4, e.count("messages"))
	require.Contains(t, e.audit.String(), `"action":"archive_replay"`)
}

func TestProtectedReads(t *testing.T) {
	e := setup(t, protectReads)
	for _, path := range []string{"/api/v1/status", "/api/v1/dead-letters", "/api/v1/dead-letters/1", "/api/v1/openapi.json"} {
		r := e.do("GET", path, nil)
		require.Equal(t, 401, r.Status, path)
		require.Contains(t, r.errorMessage(t), "token", path)
		require.Equal(t, 401, e.do("GET", path, nil, bearer("wrong-token-0123456789")...).Status, path)
	}
	require.Equal(t, 200, e.do("GET", "/api/v1/status", nil, bearer(readToken)...).Status)
	require.Equal(t, 200, e.do("GET", "/api/v1/status", nil, bearer(adminToken)...).Status)
	// A browser reads the UI with Basic authentication (password: a token).
	r := e.do("GET", "/ui/", nil)
	require.Equal(t, 401, r.Status)
	require.Contains(t, r.Header.Get("WWW-Authenticate"), "Basic")
	req, _ := http.NewRequest("GET", e.srv.URL+"/ui/", nil)
	req.SetBasicAuth("anyone", readToken)
	res, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, 200, res.StatusCode)
}

// Issue 48: the dead letters carry the application's payloads and
// headers, so that by default they need a token, in the API and in the
// UI, while the status and the overview stay open; without tokens they
// are refused, saying what to set; --admin-open-payloads serves them to
// anyone.
func TestDeadLettersNeedATokenByDefault(t *testing.T) {
	payloadReads := []string{"/api/v1/dead-letters", "/api/v1/dead-letters/1", "/ui/dead-letters", "/ui/dead-letters/1"}
	openReads := []string{"/api/v1/status", "/api/v1/openapi.json", "/ui/", "/ui/relays", "/ui/routes"}
	secret := `{"card":"4111 1111 1111 1111"}`
	secret64 := base64.StdEncoding.EncodeToString([]byte(secret))
	seed := func(e *env) {
		e.deadLetters(1)
		e.exec(`UPDATE {s}.dead_letters SET payload = convert_to($1, 'UTF8'), headers = '{"authorization":"Bearer abc"}' WHERE id = 1`, secret)
	}
	refused := func(t *testing.T, r resp, path string) {
		t.Helper()
		// The whole number (a page names the serving process's pid, which
		// may be 4111), as the UI shows it and as the API encodes it.
		require.NotContains(t, string(r.Body), "4111 1111 1111 1111", path)
		require.NotContains(t, string(r.Body), secret64, path)
		require.NotContains(t, string(r.Body), "Bearer abc", path)
	}

	t.Run("tokens", func(t *testing.T) {
		e := setup(t)
		seed(e)
		for _, path := range payloadReads {
			r := e.do("GET", path, nil)
			require.Equal(t, 401, r.Status, path)
			refused(t, r, path)
			require.Contains(t, string(r.Body), "payloads and headers, which need a token", path)
			if strings.HasPrefix(path, "/ui/") {
				require.Contains(t, r.Header.Get("WWW-Authenticate"), "Basic", "%s: a browser asks for the token", path)
			} else {
				require.Contains(t, r.Header.Get("WWW-Authenticate"), "Bearer", path)
			}
			r = e.do("GET", path, nil, bearer("wrong-token-0123456789")...)
			require.Equal(t, 401, r.Status, path)
			refused(t, r, path)
			for _, tok := range []string{readToken, adminToken} {
				r = e.do("GET", path, nil, bearer(tok)...)
				require.Equal(t, 200, r.Status, "%s: %s", path, r.Body)
				shown := "4111 1111 1111 1111"
				if strings.HasPrefix(path, "/api/") {
					shown = secret64
				}
				if strings.HasSuffix(path, "/1") {
					require.Contains(t, string(r.Body), shown, "%s: what the refusals must not show", path)
				}
			}
			r = e.do("GET", path, nil, basic(readToken)...)
			require.Equal(t, 200, r.Status, "%s: %s", path, r.Body)
		}
		r := e.do("GET", "/api/v1/dead-letters/1", nil, bearer(readToken)...)
		require.Contains(t, string(r.Body), "Bearer abc", "the headers, with the token")
		for _, path := range openReads {
			require.Equal(t, 200, e.do("GET", path, nil).Status, path)
		}
	})

	t.Run("no tokens", func(t *testing.T) {
		e := setup(t, noTokens)
		seed(e)
		for _, path := range payloadReads {
			for _, header := range [][]string{nil, bearer(readToken)} {
				r := e.do("GET", path, nil, header...)
				require.Equal(t, 403, r.Status, path)
				refused(t, r, path)
				require.Empty(t, r.Header.Get("WWW-Authenticate"), "%s: no token could help", path)
				body := string(r.Body)
				require.Contains(t, body, "--admin-token-file", "%s says what to set", path)
				require.Contains(t, body, "--admin-open-payloads", "%s says what to set", path)
			}
		}
		for _, path := range openReads {
			require.Equal(t, 200, e.do("GET", path, nil).Status, path)
		}
	})

	for name, opts := range map[string][]option{
		"open payloads":            {openPayloads},
		"open payloads, no tokens": {openPayloads, noTokens},
	} {
		t.Run(name, func(t *testing.T) {
			e := setup(t, opts...)
			seed(e)
			for _, path := range payloadReads {
				r := e.do("GET", path, nil)
				require.Equal(t, 200, r.Status, "%s: %s", path, r.Body)
			}
			require.Contains(t, string(e.do("GET", "/api/v1/dead-letters/1", nil).Body), "Bearer abc")
		})
	}
}

func TestNewRefusesReadsProtectedWithoutTokens(t *testing.T) {
	_, err := console.New(console.Config{Admin: &operator.Admin{}, ProtectReads: true})
	require.ErrorContains(t, err, "--admin-token-file")
	tokens, err := console.ParseTokens(strings.NewReader("a:" + adminToken))
	require.NoError(t, err)
	_, err = console.New(console.Config{Admin: &operator.Admin{}, Tokens: tokens, ProtectReads: true, OpenPayloads: true})
	require.ErrorContains(t, err, "--admin-read-token")
	require.ErrorContains(t, err, "--admin-open-payloads")
	_, err = console.New(console.Config{})
	require.ErrorContains(t, err, "Admin")
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                          "no token",
		"# only a comment\n\n":      "no token",
		"alice":                     "line 1: want name:token",
		"alice:short":               "shorter than 16",
		":0123456789abcdef":         "name is empty",
		"a b:0123456789abcdef":      "spaces",
		"alice:0123456789abcdef:rw": "line 1: want name:token",
		"alice:0123456789abcdef\nalice:0123456789abcdeX":     "line 2: name \"alice\" is used twice",
		"alice:0123456789abcdef\n\nbob:0123456789abcdef":     "line 3: token \"bob\" is the same",
		"alice:0123456789abcdef:read\nbob:0123456789abcdefg": "",
	} {
		_, err := console.ParseTokens(strings.NewReader(in))
		if want == "" {
			require.NoError(t, err, in)
			continue
		}
		require.ErrorContains(t, err, want, fmt.Sprintf("%q", in))
		require.NotContains(t, err.Error(), "0123456789abcdef", "the error does not repeat a token")
	}
}

// Issue 18: a key held behind a dead letter (on-dead-letter hold) shows in
// the status (held per route, the holds), in the dead-letter list (holds
// the key, messages behind) and on the UI's overview and list; the answers
// match the OpenAPI document.
func TestHeldKeys(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.messages (id, topic, key, payload, available_at, attempts, held_since, held_route) VALUES
    (3, 'orders', 'agg', '3', 'infinity', 1, now() - interval '10 minutes', 'events'),
    (4, 'orders', 'agg', '4', NULL, 0, NULL, NULL),
    (5, 'orders', 'agg', '5', NULL, 0, NULL, NULL);
INSERT INTO {s}.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, last_error)
SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent', 'HTTP 422' FROM {s}.messages WHERE id = 3`)
	r := e.do("GET", "/api/v1/status", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	var st struct {
		Pending int64
		Held    []struct {
			Route string
			Keys  int64
		}
		Holds []struct {
			Route, Key string
			ID         int64 `json:"dead_letter_id"`
			Behind     int64
		}
	}
	r.json(t, &st)
	require.EqualValues(t, 2, st.Pending, "the parked dead letter is not pending")
	require.Len(t, st.Held, 1)
	require.Equal(t, "events", st.Held[0].Route)
	require.EqualValues(t, 1, st.Held[0].Keys)
	require.Len(t, st.Holds, 1)
	require.Equal(t, "agg", st.Holds[0].Key)
	require.EqualValues(t, 3, st.Holds[0].ID)
	require.EqualValues(t, 2, st.Holds[0].Behind)

	r = e.do("GET", "/api/v1/dead-letters", nil, bearer(readToken)...)
	require.Equal(t, 200, r.Status, string(r.Body))
	var page struct {
		DeadLetters []struct {
			ID     int64
			Holds  bool `json:"holds_key"`
			Behind int64
		} `json:"dead_letters"`
	}
	r.json(t, &page)
	require.Len(t, page.DeadLetters, 1)
	require.True(t, page.DeadLetters[0].Holds)
	require.EqualValues(t, 2, page.DeadLetters[0].Behind)

	home := e.do("GET", "/ui/", nil)
	require.Equal(t, 200, home.Status)
	require.Contains(t, string(home.Body), `<h2>Held keys</h2>`)
	require.Contains(t, string(home.Body), `<td>agg</td><td>events</td><td><a href="/ui/dead-letters/3">3</a></td>`)
	list := e.do("GET", "/ui/dead-letters", nil, basic(readToken)...)
	require.Equal(t, 200, list.Status)
	require.Contains(t, string(list.Body), `<td>yes, 2 behind</td>`)
}
