package console_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// form posts a form the way a browser without JavaScript does.
func (e *env) form(path string, v url.Values, header ...string) resp {
	e.t.Helper()
	return e.do("POST", path, v.Encode(), append([]string{"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
}

// Every page reads and acts without JavaScript: plain links, GET filters
// and a POSTed form carrying the token.
func TestUIWithoutJavaScript(t *testing.T) {
	e := setup(t)
	e.exec(`SELECT setval(pg_get_serial_sequence('{s}.messages', 'id'), 1000)`) // ids apart from the dead letters'
	e.exec(`INSERT INTO {s}.messages (topic, key, payload) VALUES ('orders', 'a', 'x'), ('orders', 'b', 'y')`)
	e.deadLetters(3)
	e.exec(`UPDATE {s}.dead_letters SET payload = '\x00ff10'::bytea WHERE id = 2`)

	page := func(path string) string {
		t.Helper()
		r := e.do("GET", path, nil, basic(readToken)...)
		require.Equal(t, 200, r.Status, "%s: %s", path, r.Body)
		require.Equal(t, "text/html; charset=utf-8", r.Header.Get("Content-Type"))
		require.Contains(t, r.Header.Get("Content-Security-Policy"), "script-src 'self'")
		return string(r.Body)
	}
	home := page("/ui/")
	require.Contains(t, home, `data-topic="orders"`)
	require.Contains(t, home, "answered by test-relay")
	require.Contains(t, home, "oldest pending age", "generic columns, titled from the JSON field")

	list := page("/ui/dead-letters?topic=orders")
	require.Contains(t, list, `href="/ui/dead-letters/1"`)
	require.Contains(t, list, `href="/ui/dead-letters/3"`)
	require.NotContains(t, list, `href="/ui/dead-letters/2"`, "filtered out")
	require.Contains(t, list, `/ui/confirm?action=replay&amp;topic=orders`)

	show := page("/ui/dead-letters/1")
	require.Contains(t, show, "{\n  &#34;order&#34;: 1\n}", "a JSON payload is pretty-printed")
	require.Contains(t, show, "OrderPlaced", "headers")
	bin := page("/ui/dead-letters/2")
	require.Contains(t, bin, "00 ff 10", "a binary payload shows as hex")

	confirm := page("/ui/confirm?action=replay&topic=orders")
	require.Contains(t, confirm, "<strong>2</strong> dead letters to replay", "the count comes from a dry run")
	require.Equal(t, 3, e.count("dead_letters"), "the preview changed nothing")
	require.Contains(t, confirm, `name="token"`)

	sel := url.Values{"topic": {"orders"}}
	r := e.form("/ui/dead-letters/replay", sel)
	require.Equal(t, 403, r.Status, "no token, no replay")
	require.Empty(t, r.Header.Get("WWW-Authenticate"), "no Basic challenge: the browser would ask for a password the form does not read")
	sel.Set("token", "not-the-token-0123456789")
	r = e.form("/ui/dead-letters/replay", sel)
	require.Equal(t, 403, r.Status, "a wrong token")
	require.Contains(t, string(r.Body), "not one of --admin-token-file")
	r = e.form("/ui/dead-letters/replay", url.Values{"token": {adminToken}, "topic": {strings.Repeat("x", console.MaxBodyBytes)}})
	require.Equal(t, 413, r.Status, "the form is bounded too")
	withToken := url.Values{"topic": {"orders"}, "token": {readToken}}
	r = e.form("/ui/dead-letters/replay", withToken)
	require.Equal(t, 403, r.Status, "a read-only token cannot replay")
	withToken.Set("token", adminToken)
	r = e.form("/ui/dead-letters/replay", withToken, "Origin", "https://evil.example")
	require.Equal(t, 403, r.Status, "another site's form is refused")
	require.Equal(t, 3, e.count("dead_letters"))

	r = e.form("/ui/dead-letters/replay", withToken, "Origin", e.srv.URL)
	require.Equal(t, 200, r.Status, string(r.Body))
	require.Contains(t, string(r.Body), "Replayed <strong>2</strong> dead letters (token alice)")
	require.Equal(t, 1, e.count("dead_letters"))
	require.Contains(t, e.audit.String(), `"token":"alice"`)

	r = e.form("/ui/dead-letters/purge", url.Values{"id": {"2"}, "token": {adminToken}})
	require.Equal(t, 200, r.Status, string(r.Body))
	require.Zero(t, e.count("dead_letters"))

	require.Contains(t, page("/ui/relays"), "Lanes per route")
	require.Contains(t, page("/ui/routes"), "https://hooks.example/x?secret=xxxxx")

	r = e.do("GET", "/ui/dead-letters/99", nil, basic(readToken)...)
	require.Equal(t, 404, r.Status)
	require.Contains(t, string(r.Body), "no such dead letter")
	r = e.do("GET", "/ui/static/console.css", nil)
	require.Equal(t, 200, r.Status)
}

func TestUIReadOnlyWithoutTokens(t *testing.T) {
	e := setup(t, noTokens)
	e.deadLetters(1)
	r := e.do("GET", "/ui/confirm?action=purge&id=1", nil)
	require.Equal(t, 200, r.Status)
	require.Contains(t, string(r.Body), "disabled: start the relay with <code>--admin-token-file</code>")
	r = e.form("/ui/dead-letters/purge", url.Values{"id": {"1"}, "token": {adminToken}})
	require.Equal(t, 403, r.Status)
	require.Contains(t, string(r.Body), "--admin-token-file")
	require.Equal(t, 1, e.count("dead_letters"))
}

// The sampler keeps an hour of samples and the overview draws them.
func TestSamplerSparkline(t *testing.T) {
	e := setup(t)
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	s := console.NewSampler(admin, 20*time.Minute, slog.Default()) // 3 samples an hour
	ctx := context.Background()
	for i := range 5 {
		e.exec(`INSERT INTO {s}.messages (topic, payload) SELECT 'orders', 'x' FROM generate_series(1, $1)`, i+1)
		s.Sample(ctx)
	}
	c, err := console.New(console.Config{Admin: admin, Samples: s})
	require.NoError(t, err)
	html := console.RenderForTest(t, c, "/ui/")
	require.Contains(t, html, `aria-label="backlog, last hour, max 15"`)
	require.Contains(t, html, "peak 15")
	require.Contains(t, html, `aria-label="oldest pending age, last hour, max`, "and a sparkline of the lag")
	require.Equal(t, []int64{6, 10, 15}, console.SeriesForTest(s, "orders"), "the ring keeps the last hour: the newest 3")
}

// A large binary payload's hex dump is cut, saying how much is left out.
func TestUILargePayload(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.dead_letters (id, message_id, topic, payload, headers, created_at, attempts, reason)
VALUES (1, gen_random_uuid(), 't', decode(repeat('00ff', 50000), 'hex'), '{}', now(), 1, 'permanent')`)
	r := e.do("GET", "/ui/dead-letters/1", nil, basic(readToken)...)
	require.Equal(t, 200, r.Status)
	require.Contains(t, string(r.Body), "… 83616 more bytes")
	require.Less(t, len(r.Body), 120<<10)
}

// Issue 34: while relays of one route run different configurations
// (allowed with --allow-config-change), the overview says so, with the
// relays of each configuration; a route whose relays agree shows nothing.
func TestOverviewShowsRoutesWhoseRelaysDisagree(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.relays (id, hostname, pid, version, backend_pid, route, config_hash, config_summary) VALUES
		('web-1', 'h', 1, 'v', 0, 'orders', '1:aa', 'sink https://hooks.example/orders, topics *, on-dead-letter skip'),
		('cli-1', 'h', 2, 'v', 0, 'orders', '1:bb', 'sink stdout, topics *, on-dead-letter skip'),
		('au-1', 'h', 3, 'v', 0, 'audit', '1:cc', 'sink stdout, topics audit.*, on-dead-letter skip'),
		('au-2', 'h', 4, 'v', 0, 'audit', '1:cc', 'sink stdout, topics audit.*, on-dead-letter skip')`)
	r := e.do("GET", "/ui/", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	home := string(r.Body)
	require.Contains(t, home, `id="mixed-configs"`)
	require.Contains(t, home, "its relays run 2 different configurations and share its lanes")
	require.Contains(t, home, "web-1: sink https://hooks.example/orders, topics *, on-dead-letter skip")
	require.Contains(t, home, "cli-1: sink stdout, topics *, on-dead-letter skip")
	require.NotContains(t, home, "au-1", "the audit route's relays agree")
}

// Issue 34: the overview says why messages retry, puts a banner over a
// topic failing for longer than FailingAfter and over new dead letters,
// highlights a single dead letter, says plainly that no relay runs, and
// shows no peak before it has a history.
func TestOverviewSaysWhatIsWrong(t *testing.T) {
	e := setup(t)
	admin, err := operator.New(e.pool, e.schema)
	require.NoError(t, err)
	s := console.NewSampler(admin, time.Minute, slog.Default())
	c, err := console.New(console.Config{Admin: admin, Samples: s, FailingAfter: 5 * time.Minute})
	require.NoError(t, err)
	e.exec(`INSERT INTO {s}.messages (topic, key, payload) VALUES ('orders', 'a', 'x')`)

	calm := console.RenderForTest(t, c, "/ui/")
	require.Contains(t, calm, "No relay running: messages wait until one starts")
	require.Contains(t, calm, "No message is retrying.")
	require.NotContains(t, calm, `id="banner"`)
	require.Contains(t, calm, "pending, last hour")
	require.NotContains(t, calm, "peak", "no peak before there is a history")

	s.Sample(context.Background())
	e.exec(`INSERT INTO {s}.messages (id, message_id, topic, key, payload, available_at, attempts, last_error, first_failed_at) VALUES
  (100, '00000000-0000-4000-8000-000000000100', 'billing', 'b', 'x', now() + interval '1 minute', 4, 'HTTP 503: maintenance', now() - interval '7 minutes'),
  (101, '00000000-0000-4000-8000-000000000101', 'orders', 'c', 'x', now() + interval '1 minute', 1, 'HTTP 429: slow down', now() - interval '1 minute')`)
	e.deadLetters(1)
	s.Sample(context.Background())

	html := console.RenderForTest(t, c, "/ui/")
	require.Regexp(t, `(?s)id="banner".*Messages of topic billing have been failing for 7m\d\ds: HTTP 503: maintenance`, html)
	require.NotContains(t, html, "Messages of topic orders have been failing", "a minute is under the threshold")
	require.Regexp(t, `(?s)id="banner".*1 new dead letter in the last`, html)
	require.Regexp(t, `(?s)<table id="retry-errors">.*<tr class="alert"><td class="nowrap">billing</td>.*00000000-0000-4000-8000-000000000100.*HTTP 503: maintenance.*<tr><td class="nowrap">orders</td>.*HTTP 429: slow down`, html)
	require.Regexp(t, `<tr data-topic="orders">.*<td class="alert">1</td><td class="spark-cell">`, html, "a single dead letter is highlighted")
	require.Contains(t, html, "peak 2", "a history of two samples has a peak")
}

// Issue 37: the overview shows, per route, whether its destination is
// down (a badge, since when, the probes, the cause, and a banner), as its
// relays' heartbeats recorded it; the API says the same.
func TestRouteHealth(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.relays (id, hostname, pid, version, route, backend_pid, down_since, down_cause, down_probes) VALUES
    ('r-orders', 'h', 1, 'v', 'orders', 1, NULL, NULL, 0),
    ('r-billing-1', 'h', 2, 'v', 'billing', 2, now() - interval '3 minutes', 'not sent: dial tcp 10.0.0.7:443: connect: connection refused', 7),
    ('r-billing-2', 'h', 3, 'v', 'billing', 3, now() - interval '2 minutes', 'HTTP 503: maintenance', 12)`)

	r := e.do("GET", "/api/v1/status", nil)
	require.Equal(t, 200, r.Status, string(r.Body))
	var st struct {
		Relays []struct {
			ID, State  string
			DownProbes int `json:"down_probes"`
		}
		Routes []struct {
			Route, State string
			Relays       int
			RelaysDown   int        `json:"relays_down"`
			DownSince    *time.Time `json:"down_since"`
			DownCause    string     `json:"down_cause"`
			DownProbes   int        `json:"down_probes"`
		} `json:"route_health"`
	}
	r.json(t, &st)
	require.Len(t, st.Routes, 2)
	billing := st.Routes[0]
	require.Equal(t, "billing", billing.Route)
	require.Equal(t, "destination_down", billing.State)
	require.Equal(t, 2, billing.Relays)
	require.Equal(t, 2, billing.RelaysDown)
	require.Contains(t, billing.DownCause, "connection refused", "the earliest relay's cause")
	require.Equal(t, 12, billing.DownProbes, "the most probes")
	require.Greater(t, time.Since(*billing.DownSince), 2*time.Minute+30*time.Second)
	require.Equal(t, "delivering", st.Routes[1].State)
	require.Nil(t, st.Routes[1].DownSince)

	r = e.do("GET", "/ui/", nil)
	require.Equal(t, 200, r.Status)
	home := string(r.Body)
	require.Regexp(t, `<tr data-route="billing">.*<span class="badge down">destination down</span>.*\(3m\d\ds ago\)</span></td><td>12</td><td>2 of 2 down</td><td class="err">not sent: dial tcp`, home)
	require.Contains(t, home, `<tr data-route="orders"><td class="nowrap">orders</td><td class="nowrap"><span class="badge ok">delivering</span>`)
	require.Regexp(t, `id="banner"[^>]*><p>Route billing: destination down for 3m\d\ds \(12 probes\): not sent`, home)
	require.Less(t, strings.Index(home, `data-route="billing"`), strings.Index(home, `data-route="orders"`), "the routes that are down first")

	r = e.do("GET", "/ui/relays", nil)
	require.Equal(t, 200, r.Status)
	require.Contains(t, string(r.Body), "destination_down")
}

// Issue 37: the overview shows a rate-limited route and a degraded one
// (a badge each, since when, the cause), after the routes whose
// destination is down and before the ones that deliver; neither gets a
// banner.
func TestRouteHealthRateLimitedAndDegraded(t *testing.T) {
	e := setup(t)
	e.exec(`INSERT INTO {s}.relays (id, hostname, pid, version, route, backend_pid, limited_since, limited_cause, failing_since, last_error) VALUES
    ('r-orders', 'h', 1, 'v', 'orders', 1, NULL, NULL, NULL, NULL),
    ('r-mail', 'h', 2, 'v', 'mail', 2, now() - interval '2 minutes', 'rate limit 50/s (burst 50)', NULL, NULL),
    ('r-billing', 'h', 3, 'v', 'billing', 3, NULL, NULL, now() - interval '4 minutes', 'HTTP 500: key k7')`)

	r := e.do("GET", "/ui/", nil)
	require.Equal(t, 200, r.Status)
	home := string(r.Body)
	require.Regexp(t, `<tr data-route="mail">.*<span class="badge limited">rate limited</span>.*\(2m\d\ds ago\)</span></td><td>—</td><td>1 of 1 rate limited</td><td class="err">rate limit 50/s \(burst 50\)</td>`, home)
	require.Regexp(t, `<tr data-route="billing">.*<span class="badge degraded">degraded</span>.*\(4m\d\ds ago\)</span></td><td>—</td><td>1 of 1 degraded</td><td class="err">HTTP 500: key k7</td>`, home)
	require.NotContains(t, home, `id="banner"`)
	mail, billing, orders := strings.Index(home, `data-route="mail"`), strings.Index(home, `data-route="billing"`), strings.Index(home, `data-route="orders"`)
	require.Less(t, mail, billing, "rate limited before degraded")
	require.Less(t, billing, orders, "degraded before delivering")
}
