package cli_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// chromium finds the headless browser (Debian's chromium package, which
// `make services` installs).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testkit.Unavailable(t, "tool", "chromium not found: run make services (scripts/services.sh chromium installs Debian's chromium and chromium-driver)")
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// tab. The background networking flags keep it from calling home, which a
// closed network makes it wait on.
func browser(t *testing.T) *tab {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1100, 720),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium") // no timeout here: it would stop the browser
	// The console asks once more before it replays (a confirm dialog):
	// accept it.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return &tab{t: t, ctx: ctx}
}

type tab struct {
	t   *testing.T
	ctx context.Context
}

// do runs steps, each run bounded so that a missing element fails the
// test instead of hanging it.
func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, steps...))
}

// text returns the visible text of the element sel.
func (b *tab) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	return s
}

// eval returns the value of a JavaScript expression on the page.
func eval[T any](b *tab, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(b.t, err, expr)
	return v
}

// screenshot saves the page as docs/console/name.png when
// CONSOLE_SCREENSHOTS=1 (the README shows them; CI does not rewrite them).
func (b *tab) screenshot(name string) {
	b.t.Helper()
	if os.Getenv("CONSOLE_SCREENSHOTS") != "1" {
		return
	}
	buf, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	require.NoError(b.t, err)
	require.NoError(b.t, os.WriteFile(filepath.Join("..", "..", "..", "docs", "console", name+".png"), buf, 0o644))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// A relay process serving two routes, its console driven from a real
// browser: the overview shows the backlog of a route whose webhook is
// down; the dead letters page finds, by filter, the message the other
// webhook refused; the operator replays it with the token, and the relay
// delivers it.
func TestConsoleInBrowser(t *testing.T) {
	b := browser(t)
	pool, schema, w := e2e(t)
	const token = "ops-token-0123456789abcdef"

	var mu sync.Mutex
	var delivered []string
	refuse := true // the orders webhook refuses the poison message
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		body := r.Body
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.URL.Path == "/billing":
			return http.StatusServiceUnavailable, "maintenance"
		case strings.Contains(string(body), "poison") && refuse:
			return http.StatusUnprocessableEntity, "schema validation failed: total is required"
		default:
			delivered = append(delivered, string(body))
		}
		return http.StatusOK, ""
	})
	// The receiver is up (it answers the HTTP sink's HEAD): the billing
	// webhook's 503s are its messages' failures, retried, not an outage.
	srv.SetHealth(func() int { return http.StatusOK })
	got := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range delivered {
			if strings.Contains(d, s) {
				return true
			}
		}
		return false
	}

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokenFile, []byte("ops:"+token+"\n"), 0o600))
	cfgFile := filepath.Join(dir, "relay.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
retry-initial: 200ms
retry-max: 1s
console-failing-after: 1s
routes:
  - name: orders
    topics: ["orders.*"]
    sink: %[1]s/orders
  - name: billing
    topics: ["billing.*"]
    sink: %[1]s/billing
    max-attempts: 1000
`, srv.Base())), 0o600))
	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(context.Background())
	logs := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(runCtx, []string{"run", "--config", cfgFile, "--admin-addr", addr,
			"--admin-token-file", tokenFile, "--console-sample-interval", "1s"}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()

	bg := context.Background()
	tx, err := pool.Begin(bg)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{Topic: "orders.placed", Key: fmt.Sprintf("c%d", i%3), Payload: []byte(fmt.Sprintf(`{"order":%d}`, i))})
		msgs = append(msgs, outbox.Message{Topic: "billing.invoiced", Key: fmt.Sprintf("c%d", i%3), Payload: []byte(fmt.Sprintf(`{"invoice":%d}`, i))})
	}
	msgs = append(msgs, outbox.Message{Topic: "orders.placed", Key: "c9", Payload: []byte(`{"order":"poison","lines":[{"sku":"A-1","qty":2}]}`),
		Headers: map[string]string{"type": "OrderPlaced"}})
	require.NoError(t, w.Write(bg, tx, msgs...))
	require.NoError(t, tx.Commit(bg))

	dead := func() int {
		var n int
		require.NoError(t, pool.QueryRow(bg, "SELECT count(*) FROM "+migrations.Ident(schema)+".dead_letters").Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return dead() == 1 && got(`{"order":9}`) }, 20*time.Second, 50*time.Millisecond,
		"the poison order is dead-lettered, the others delivered: %s", logs.String())

	base := "http://" + addr
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	// The overview draws a sparkline once the relay has two samples (one
	// a second here).
	spark := chromedp.CSSAll(`tr[data-topic="billing.invoiced"] svg.spark`)
	// 15 s a page load and 60 s in all: with the rest of the suite on the
	// same 2 cores, 5 s a load never once sufficed.
	var last atomic.Value
	last.Store("no page loaded")
	drawn := assert.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		defer cancel()
		err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(css(`tr[data-topic="billing.invoiced"]`)))
		if err != nil {
			last.Store("overview: " + err.Error())
			return false
		}
		n, err := chromedp.Run(ctx, chromedp.Nodes(spark, chromedp.AtLeast(0)))
		last.Store(fmt.Sprintf("%d sparklines (%v)", len(n), err))
		return err == nil && len(n) == 2 // backlog and lag
	}, 60*time.Second, 300*time.Millisecond)
	require.True(t, drawn, "sparklines of the sampled backlog and lag; last look: %s", last.Load())
	require.Regexp(t, `billing\.invoiced\s+10\s`, b.text(`#topics`), "the backlog of the route whose webhook is down")
	// Issue 34: the overview says why they retry (the webhook's answer),
	// and, once they have been failing for longer than
	// console-failing-after, says so in a banner; the dead letter's
	// count of 1 is highlighted.
	// The page is read again until the first failures are settled and
	// have lasted a second.
	banner := func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		defer cancel()
		if chromedp.Do(ctx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(css(`#retry-errors`))) != nil {
			return false
		}
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("banner") || {}).innerText || ""`))
		return err == nil && strings.Contains(s, "Messages of topic billing.invoiced") && strings.Contains(s, "maintenance")
	}
	require.True(t, assert.Eventually(t, banner, 30*time.Second, 500*time.Millisecond), "a banner over the billing route failing for more than 1s; topics: %s", b.text(`#topics`))
	why := b.text(`#retry-errors`)
	require.Regexp(t, `billing\.invoiced\s+\(outbox\)\s+\d+\s`, why, "the retrying messages of the billing topic (messages of the outbox, not fan-out copies)")
	require.Contains(t, why, "503", "the webhook's status")
	require.Contains(t, why, "maintenance", "the webhook's answer")
	alerts := eval[[]string](b, `Array.from(document.querySelectorAll('tr[data-topic="orders.placed"] td.alert')).map(td => td.innerText)`)
	require.Contains(t, alerts, "1", "the single dead letter of orders.placed is highlighted")
	// Fluid width: the content spans the window, not a fixed column.
	fill := eval[float64](b, `document.querySelector("main").getBoundingClientRect().width / window.innerWidth`)
	require.Greater(t, fill, 0.9, "main spans the window")
	require.Contains(t, b.text(`#answered-by`), fmt.Sprintf("pid %d", os.Getpid()), "the page says which relay answered")
	// The default route, which no relay runs beside the routes table,
	// is not counted as unworked.
	// Under a loaded machine a relay's heartbeat can come later than its
	// lease TTL, and its lanes count as unworked until the next one: the
	// page is read again for up to 30 s.
	worked := regexp.MustCompile(`^\s*Every lane of the served routes held by a live relay`)
	summary := b.text(`#lanes-summary`)
	reread, cancelReread := context.WithTimeout(bg, 30*time.Second)
	testkit.Poll(reread, time.Second, func() bool {
		if worked.MatchString(summary) {
			return true
		}
		t.Logf("lanes summary %q; reading the overview again", summary)
		b.do(chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(css(`#lanes-summary`)))
		summary = b.text(`#lanes-summary`)
		return worked.MatchString(summary)
	})
	cancelReread()
	if !worked.MatchString(summary) {
		// Say what the tables held: the lanes of which route, leased
		// until when, by which relay, and the relays' heartbeats.
		rows, err := pool.Query(bg, `SELECT l.route, coalesce(l.owner, '-'), count(*), coalesce(min(l.lease_until - now())::text, '-'), coalesce(max(l.lease_until - now())::text, '-'),
       coalesce((SELECT (now() - r.heartbeat_at)::text FROM `+migrations.Ident(schema)+`.relays r WHERE r.id = l.owner), 'no relay row')
FROM `+migrations.Ident(schema)+`.lanes l GROUP BY l.route, l.owner ORDER BY 1, 2`)
		require.NoError(t, err)
		for rows.Next() {
			var route, owner, minLease, maxLease, heartbeat string
			var n int
			require.NoError(t, rows.Scan(&route, &owner, &n, &minLease, &maxLease, &heartbeat))
			t.Logf("route %q owner %s: %d lanes, lease left %s..%s, heartbeat %s ago", route, owner, n, minLease, maxLease, heartbeat)
		}
		require.NoError(t, rows.Err())
		t.Fatalf("lanes summary %q, want 0 unworked lanes; logs:\n%s", summary, logs.String())
	}
	b.screenshot("overview")

	// The dead letters carry the application's payloads and headers: a
	// browser without the token is challenged (Basic: it asks for the
	// token as the password) and shown none of them; once its user typed
	// it, the browser sends it with every request, as here.
	res, err := http.Get(base + "/ui/dead-letters")
	require.NoError(t, err)
	challenged, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, "%s", challenged)
	require.Contains(t, res.Header.Get("WWW-Authenticate"), "Basic")
	require.NotContains(t, string(challenged), "poison")
	_, err = chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("operator:"+token))}})
	require.NoError(t, err)

	b.do(chromedp.Navigate(base+"/ui/dead-letters"),
		chromedp.SendKeys(css(`#filter input[name="topic"]`), "orders.placed"),
		chromedp.SendKeys(css(`#filter input[name="key"]`), "c9"))
	// The submit navigates: RunResponse returns once the filtered page
	// has loaded, so no node of the page it leaves is used after.
	fctx, cancelFilter := context.WithTimeout(b.ctx, 15*time.Second)
	_, err = chromedp.RunResponse(fctx, chromedp.Submit(css(`#filter`)))
	cancelFilter()
	require.NoError(t, err)
	b.do(chromedp.WaitVisible(css(`#dead-letters a[href^="/ui/dead-letters/"]`)))
	text := b.text(`#dead-letters`)
	// Short cells (id, route, topic, key, reason, time) stay on one line.
	wrapped := eval[[]string](b, `Array.from(document.querySelectorAll("#dead-letters td.nowrap")).filter(td => {
		const r = document.createRange(); r.selectNodeContents(td);
		return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size > 1;
	}).map(td => td.innerText)`)
	require.Empty(t, wrapped, "wrapped short cells")
	placeholder := eval[string](b, `document.querySelector('#filter input[name="dead_after"]').placeholder`)
	require.NotRegexp(t, `\d`, placeholder, "the date filter's placeholder shows a form, not a date")
	require.Contains(t, text, "permanent")
	require.Contains(t, text, "total is required", "the webhook's reason")
	b.screenshot("dead-letters")

	href := eval[string](b, `document.querySelector('#dead-letters a[href^="/ui/dead-letters/"]').getAttribute("href")`)
	b.do(chromedp.Navigate(base+href), chromedp.WaitVisible(css(`#payload-json`)))
	require.Contains(t, b.text(`#payload-json`), "\"lines\": [\n    {\n      \"sku\": \"A-1\"", "the JSON payload is pretty-printed")
	b.screenshot("dead-letter")

	mu.Lock()
	refuse = false // the receiver is fixed: replay the message
	mu.Unlock()
	b.do(chromedp.Click(css(`#replay`)), chromedp.WaitVisible(css(`#count`)), chromedp.SendKeys(css(`#token`), token))
	require.Contains(t, b.text(`#count`), "finds 1 dead letter to replay", "the count of a dry run")
	require.Equal(t, 1, dead(), "nothing replayed before the confirmation")
	b.screenshot("confirm")
	b.do(chromedp.Click(css(`#act button[type="submit"]`)), chromedp.WaitVisible(css(`#result`)))
	require.Contains(t, b.text(`#result`), "Replayed 1 dead letter (token ops)")
	require.Eventually(t, func() bool { return got("poison") }, 10*time.Second, 20*time.Millisecond, "the relay delivers the replayed message")
	require.Zero(t, dead())

	b.do(chromedp.Navigate(base+"/ui/relays"), chromedp.WaitVisible(css(`#relays`)))
	text = b.text(`#relays`)
	require.Contains(t, text, "orders")
	require.Contains(t, text, "billing")
	b.screenshot("relays")
	b.do(chromedp.Navigate(base+"/ui/routes"), chromedp.WaitVisible(css(`#routes`)))
	text = b.text(`#routes`)
	require.Contains(t, text, "billing.*")
	require.Contains(t, text, srv.Base()+"/…", "the sink, redacted")
	b.screenshot("routes")
	require.Contains(t, logs.String(), `console audit`, "the replay is in the audit log")
}

// Issue 37: a relay process whose billing webhook refuses connections
// finds that destination down; its heartbeat records it, and the console's
// overview shows it in a browser: a "destination down" badge on the
// billing route, since when, the probes and the cause, and a banner,
// while the orders route shows "delivering"; a mail route that waits for
// its rate limit shows "rate limited", since when and the limit.
func TestConsoleShowsDestinationDownInBrowser(t *testing.T) {
	b := browser(t)
	pool, _, w := e2e(t)
	srv := testkit.NewTestReceiver(t, func(*testkit.Request) (int, string) { return http.StatusOK, "" })
	closed := "http://" + freeAddr(t) + "/billing" // nothing listens: connections are refused

	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "relay.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
heartbeat: 200ms
routes:
  - name: orders
    topics: ["orders.*"]
    sink: %s/orders
  - name: billing
    topics: ["billing.*"]
    sink: %s
  - name: mail
    topics: ["mail.*"]
    sink: %s/mail
    rate-limit: 1
`, srv.Base(), closed, srv.Base())), 0o600))
	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(context.Background())
	logs := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(runCtx, []string{"run", "--config", cfgFile, "--admin-addr", addr}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()

	bg := context.Background()
	tx, err := pool.Begin(bg)
	require.NoError(t, err)
	for i := range 6 {
		require.NoError(t, w.Write(bg, tx,
			outbox.Message{Topic: "orders.placed", Key: fmt.Sprintf("c%d", i%3), Payload: []byte(`{}`)},
			outbox.Message{Topic: "billing.invoiced", Key: fmt.Sprintf("c%d", i%3), Payload: []byte(`{}`)}))
	}
	for i := range 60 { // a minute at the mail route's rate limit: it stays rate limited while the test looks
		require.NoError(t, w.Write(bg, tx, outbox.Message{Topic: "mail.sent", Key: fmt.Sprintf("m%d", i%3), Payload: []byte(`{}`)}))
	}
	require.NoError(t, tx.Commit(bg))

	base := "http://" + addr
	// Each route's row comes with its relay's first report: the orders
	// route's is waited for too, before the page that shows billing down
	// (loaded last, it has both).
	b.awaitBadge(base, `#route-health tr[data-route="orders"] .badge`, "the orders route's badge", logs)
	badge := `#route-health tr[data-route="billing"] .badge.down`
	b.awaitBadge(base, badge, "the billing route's badge", logs)
	require.Equal(t, "destination down", b.text(badge))
	row := b.text(`#route-health tr[data-route="billing"]`)
	require.Regexp(t, `\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(\d+(ms|s) ago\)`, row, "since when")
	require.Contains(t, row, "not sent", "the cause")
	require.Contains(t, row, "connection refused", "the cause")
	require.Equal(t, "delivering", b.text(`#route-health tr[data-route="orders"] .badge`))
	color := eval[string](b, `getComputedStyle(document.querySelector('`+badge+`')).backgroundColor`)
	require.Equal(t, "rgb(180, 35, 24)", color, "the badge stands out (the console's danger colour)")
	require.Contains(t, b.text(`#banner`), "Route billing: destination down for")

	// The mail route waits for its rate limit (1 message a second): a
	// heartbeat records it, and the overview shows it.
	limited := `#route-health tr[data-route="mail"] .badge.limited`
	b.awaitBadge(base, limited, "the mail route's badge", logs)
	require.Equal(t, "rate limited", b.text(limited))
	row = b.text(`#route-health tr[data-route="mail"]`)
	require.Regexp(t, `\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(\d+(ms|s) ago\)`, row, "since when")
	require.Contains(t, row, "rate limit 1/s (burst 1)", "the cause")
	require.NotContains(t, b.text(`#banner`), "mail", "a rate-limited route is no alarm")
}

// TestMissingExchangeSignalsAgreeInBrowser: the AMQP sink's exchange does
// not exist, so nothing can be delivered. /readyz, the metrics, status
// and the console (in Chromium) name one state, the destination down, and
// one reason, the missing exchange, and the relay counts no attempt.
func TestMissingExchangeSignalsAgreeInBrowser(t *testing.T) {
	b := browser(t)
	pool, schema, w := e2e(t)
	exchange := testkit.RandName("console-noexchange-")
	sink := testkit.AMQPURL() + "?exchange=" + exchange
	r := runInBackground(t, "run", "--sink", sink, "--heartbeat", "200ms")
	defer func() { require.Equal(t, 0, r.stop(), r.logs.String()) }()
	bg := context.Background()
	tx, err := pool.Begin(bg)
	require.NoError(t, err)
	for i := range 10 {
		require.NoError(t, w.Write(bg, tx, outbox.Message{Topic: "orders", Key: fmt.Sprintf("k%d", i%5), Payload: []byte(`{}`)}))
	}
	require.NoError(t, tx.Commit(bg))

	base := "http://" + r.addr
	badge := `#route-health tr[data-route=""] .badge.down`
	b.awaitBadge(base, badge, "the route's badge", r.logs)

	const state, reason = "destination down", "the exchange does not exist"
	require.Equal(t, state, b.text(badge))
	require.Contains(t, b.text(`#route-health tr[data-route=""]`), reason, "the console's reason")
	require.Contains(t, b.text(`#banner`), "destination down for")
	require.Contains(t, b.text(`#lanes-summary`), "1 relay registered")

	code, body := r.readyz()
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "outbox: "+state)
	require.Contains(t, body, reason, "/readyz's reason")

	_, metrics := get(t, base+"/metrics")
	require.Contains(t, metrics, `outbox_relay_route_state{route="",sink="amqp",state="destination_down"} 1`)
	require.Contains(t, metrics, "outbox_relay_ready 0")

	rc, out, _ := run(t, "status")
	require.Equal(t, 0, rc, out)
	require.Contains(t, out, state+" since", "status names the state")
	require.Contains(t, out, reason, "status's reason")

	var attempts int
	require.NoError(t, pool.QueryRow(bg, "SELECT coalesce(max(attempts), 0) FROM "+migrations.Ident(schema)+".messages").Scan(&attempts))
	require.Zero(t, attempts, "a missing exchange cost attempts")
}

// awaitBadge reloads the overview until it shows exactly one node of sel
// (a route's state badge: a heartbeat records the state first) and fails
// with what, the last look and the relay's log when it never does.
func (b *tab) awaitBadge(base, sel, what string, logs *testkit.SyncBuffer) {
	b.t.Helper()
	var last atomic.Value
	last.Store("no page loaded")
	shown := assert.Eventually(b.t, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#topics`))); err != nil {
			last.Store("overview: " + err.Error())
			return false
		}
		n, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSS(sel), chromedp.AtLeast(0)))
		last.Store(fmt.Sprintf("%d badges (%v)", len(n), err))
		return err == nil && len(n) == 1
	}, 60*time.Second, 300*time.Millisecond)
	require.True(b.t, shown, "%s; last look: %s; logs:\n%s", what, last.Load(), logs.String())
}

// get fetches url and returns the status code and the body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// A relay process of three sources, one on a database that does not
// answer, its console driven from a real browser: the summary lists each
// source with its state, the one that is down with its error; a source's
// link opens its own overview, whose pages keep the source.
func TestConsoleSourcesInBrowser(t *testing.T) {
	b := browser(t)
	obs := sourceOutboxes(t, "a", "b")
	for name, ob := range obs {
		ob.write(t, outbox.Message{Topic: "orders." + name, Key: "k", Payload: []byte("{}"), DeliverAt: time.Now().Add(time.Hour)})
	}
	f := sourcesFile(t, "sink: discard\n", obs, "a", "b")
	cfg, err := os.ReadFile(f)
	require.NoError(t, err)
	down := "  - name: gone\n    database-url: postgres://x@127.0.0.1:1/none?connect_timeout=1\n"
	require.NoError(t, os.WriteFile(f, append(cfg, down...), 0o600))

	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(context.Background())
	logs := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(runCtx, []string{"run", "--config", f, "--admin-addr", addr, "--connect-timeout", "1s"}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()

	base := "http://" + addr
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	var last atomic.Value
	last.Store("no page loaded")
	shown := assert.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		defer cancel()
		err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(css(`#sources tr[data-source="gone"]`)))
		if err != nil {
			last.Store("summary: " + err.Error())
			return false
		}
		rows, err := chromedp.Run(ctx, chromedp.Text(css(`#sources`)))
		last.Store(rows)
		return err == nil && strings.Count(rows, "running") == 2 && strings.Contains(rows, "down")
	}, 60*time.Second, 300*time.Millisecond)
	require.True(t, shown, "a and b running, gone down; last look: %s", last.Load())
	require.Contains(t, b.text(`#sources tr[data-source="gone"]`), "connect", "the down source's error")
	require.Regexp(t, `(?s)a\s.*running.*\s1\s`, b.text(`#sources tr[data-source="a"]`), "a's pending message counted")

	b.do(chromedp.Click(css(`#sources tr[data-source="b"] a`)), chromedp.WaitVisible(css(`#topics`)))
	require.Contains(t, b.text(`#source`), "b")
	require.Contains(t, b.text(`#topics`), "orders.b")
	require.NotContains(t, b.text(`#topics`), "orders.a")
	href := eval[[]string](b, `Array.from(document.querySelectorAll("header nav a")).map(a => a.getAttribute("href"))`)
	for _, h := range href {
		if h != "/ui/" {
			require.Contains(t, h, "source=b", "header link %s keeps the source", h)
		}
	}
}
