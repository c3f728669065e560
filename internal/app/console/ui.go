package console

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/operator"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

func staticFiles() http.Handler {
	sub, _ := fs.Sub(staticFS, "static")
	return http.FileServerFS(sub)
}

// templates holds one template set per page (each with the layout).
type templates struct {
	pages map[string]*template.Template
}

var funcs = template.FuncMap{
	"age":       age,
	"sparkline": sparkline,
	"cell":      cell,
	"alert":     alert,
	"title":     func(s string) string { return strings.ReplaceAll(strings.TrimSuffix(s, "_ns"), "_", " ") },
	"route":     func(s string) string { return cmpOr(s, "(default)") },
	// count says n things: "1 relay", "3 relays".
	"count": func(n int, one, many string) string {
		if n == 1 {
			return "1 " + one
		}
		return strconv.Itoa(n) + " " + many
	},
	"deref": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func parseTemplates() (*templates, error) {
	t := &templates{pages: map[string]*template.Template{}}
	for _, page := range []string{"overview", "deadletters", "deadletter", "confirm", "done", "relays", "routes", "error", "sources"} {
		tp, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("outbox: console template %s: %w", page, err)
		}
		t.pages[page] = tp
	}
	return t, nil
}

// pageData is what every page gets.
type pageData struct {
	Title      string
	Nav        string
	AnsweredBy Identity
	Refresh    int
	Writable   bool
	Data       any
	// Multi is true for a process of several sources (Config.Sources);
	// Source names the page's source then ("" on the summary of all).
	// SrcQ ("?source=NAME") and SrcAmp ("&source=NAME") keep the source
	// in the page's links; both are empty for a single outbox.
	Multi        bool
	Source       string
	SrcQ, SrcAmp template.URL
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, title string, data any) {
	var buf bytes.Buffer
	pd := pageData{Title: title, Nav: page, AnsweredBy: c.cfg.Relay, Writable: c.cfg.Tokens != nil, Data: data, Multi: c.multi()}
	if s := c.src(r); pd.Multi && s != nil {
		q := url.Values{"source": {s.Name}}.Encode()
		pd.Source, pd.SrcQ, pd.SrcAmp = s.Name, template.URL("?"+q), template.URL("&"+q)
	}
	if v, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && v >= 5 && v <= 3600 {
		pd.Refresh = v
	}
	if err := c.tmpl.pages[page].Execute(&buf, pd); err != nil {
		c.log.Error("console: render", "page", page, "error", err)
		http.Error(w, "outbox: console: render "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (c *Console) uiError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", http.StatusText(status), struct {
		Status  int
		Message string
	}{status, msg})
}

// table is a generic table of JSON objects: one column per field, in the
// order first seen, so that fields added to the operator's types show up
// without a change here.
type table struct {
	Columns []string
	Rows    [][]any
}

// toTable lays out rows (a slice of structs with JSON tags) as a table;
// skip names fields shown elsewhere.
func toTable(rows any, skip ...string) table {
	b, _ := json.Marshal(rows)
	var elems []json.RawMessage
	_ = json.Unmarshal(b, &elems)
	var t table
	objs := make([]map[string]json.RawMessage, len(elems))
	for i, e := range elems {
		keys, obj := orderedObject(e)
		objs[i] = obj
		for _, k := range keys {
			if !slices.Contains(t.Columns, k) && !slices.Contains(skip, k) {
				t.Columns = append(t.Columns, k)
			}
		}
	}
	for _, o := range objs {
		row := make([]any, len(t.Columns))
		for i, k := range t.Columns {
			var v any
			if raw, ok := o[k]; ok {
				_ = json.Unmarshal(raw, &v)
			}
			row[i] = column{Name: k, Value: v}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// orderedObject decodes a JSON object, keeping the order of its keys
// (json.Marshal writes a struct's fields in their declared order).
func orderedObject(b []byte) ([]string, map[string]json.RawMessage) {
	dec := json.NewDecoder(bytes.NewReader(b))
	obj := map[string]json.RawMessage{}
	var keys []string
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, obj
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		k, _ := tok.(string)
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			break
		}
		keys = append(keys, k)
		obj[k] = raw
	}
	return keys, obj
}

// column is one cell of a generic table.
type column struct {
	Name  string
	Value any
}

// cell formats a generic table's cell: durations (fields named *_ns) as
// ages, times as UTC, lists joined.
func cell(c column) string {
	switch v := c.Value.(type) {
	case nil:
		return "—"
	case float64:
		if strings.HasSuffix(c.Name, "_ns") {
			return age(time.Duration(v))
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && (strings.HasSuffix(c.Name, "_at") || strings.HasSuffix(c.Name, "_since")) {
			return t.UTC().Format("2006-01-02 15:04:05Z")
		}
		if c.Name == "route" && v == "" {
			return "(default)"
		}
		return v
	case bool:
		if v {
			return "yes"
		}
		return "no"
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// alertColumns are the columns whose non-zero counts need an operator:
// retrying messages and dead letters (a single dead letter is a message
// the relay gave up on).
var alertColumns = []string{"retrying", "dead_letters", "count"}

// alert reports whether a generic table's cell is highlighted.
func alert(c column) bool {
	v, ok := c.Value.(float64)
	return ok && v > 0 && slices.Contains(alertColumns, c.Name)
}

// age shows a duration the way an operator reads it: 0s, 850ms, 42s,
// 3m12s, 5h03m, 2d4h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// sparkline draws values as an inline SVG line, scaled to their maximum.
func sparkline(values []int64) template.HTML { return spark(values, "backlog", strconv.FormatInt) }

// spark draws values as an inline SVG line scaled to their maximum, which
// its label shows with format.
func spark(values []int64, what string, format func(int64, int) string) template.HTML {
	const w, h = 120.0, 28.0
	if len(values) < 2 {
		return template.HTML(`<span class="muted">collecting…</span>`)
	}
	top := slices.Max(values)
	var pts strings.Builder
	for i, v := range values {
		x := float64(i) * w / float64(len(values)-1)
		y := h - 2
		if top > 0 {
			y = h - 2 - float64(v)*(h-4)/float64(top)
		}
		fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
	}
	return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s, last hour, max %s">`+
		`<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="%s"/></svg>`,
		int(w), int(h), int(w), int(h), what, template.HTMLEscapeString(format(top, 10)), strings.TrimSpace(pts.String())))
}

// topicRow is a row of the overview.
type topicRow struct {
	Topic    string
	Backlog  table
	Spark    template.HTML
	Peak     int64
	LagSpark template.HTML
	PeakLag  string
	// Drawn is true once the history has two samples (a peak to show).
	Drawn bool
}

// retryErrorRow is a row of the overview's "why messages retry".
type retryErrorRow struct {
	operator.RetryError
	FirstSeen, LastSeen, Next string
	// Long is true when these messages have been failing for longer than
	// Config.FailingAfter.
	Long bool
}

// routeHealthRow is a row of the overview's "delivery per route".
type routeHealthRow struct {
	operator.RouteHealth
	// Since is when its state began, and For how long ago that was (""
	// while it delivers); Badge is its state for people, Class the
	// badge's class.
	Since, For, Badge, Class string
}

// badges are the states' badges, from the worst, with their classes.
var badges = []struct{ state, text, class string }{
	{operator.DestinationDown, "destination down", "down"},
	{operator.RateLimited, "rate limited", "limited"},
	{operator.Degraded, "degraded", "degraded"},
	{operator.Delivering, "delivering", "ok"},
}

// routeHealth lays out the routes' delivery states, the worst first, with
// a banner line for each route whose destination is down.
func routeHealth(st operator.Status) ([]routeHealthRow, []string) {
	rows := make([]routeHealthRow, len(st.Routes))
	var banners []string
	for i, h := range st.Routes {
		rows[i] = routeHealthRow{RouteHealth: h, Badge: h.State, Class: "ok"}
		for _, b := range badges {
			if b.state == h.State {
				rows[i].Badge, rows[i].Class = b.text, b.class
			}
		}
		from := h.Delivery.Since()
		if from == nil {
			continue
		}
		rows[i].Since = from.UTC().Format("2006-01-02 15:04:05Z")
		rows[i].For = age(since(st.Now, *from))
		if h.Down() {
			banners = append(banners, fmt.Sprintf("Route %s: destination down for %s (%d probes): %s",
				cmpOr(h.Route, "(default)"), rows[i].For, h.DownProbes, oneLine(h.DownCause, 200)))
		}
	}
	slices.SortStableFunc(rows, func(a, b routeHealthRow) int { return badness(b.State) - badness(a.State) })
	return rows, banners
}

// badness orders the states: the worst highest.
func badness(state string) int {
	for i, b := range badges {
		if b.state == state {
			return len(badges) - i
		}
	}
	return 0
}

// ago is how long before now t was, for a table cell.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return age(since(now, t)) + " ago"
}

// retryErrors lays out the status's retry errors and says which failed
// for too long: one banner line per topic and route (the longest failing
// of its errors).
func (c *Console) retryErrors(st operator.Status) ([]retryErrorRow, []string) {
	rows := make([]retryErrorRow, len(st.RetryErrors))
	var banners []string
	seen := map[[2]string]bool{}
	for i, e := range st.RetryErrors {
		next := "due"
		if e.NextAttempt.After(st.Now) {
			next = "in " + age(e.NextAttempt.Sub(st.Now))
		}
		failing := since(st.Now, e.FirstSeen)
		rows[i] = retryErrorRow{RetryError: e, FirstSeen: ago(st.Now, e.FirstSeen), LastSeen: ago(st.Now, e.LastSeen), Next: next,
			Long: failing > c.cfg.FailingAfter}
		k := [2]string{e.Topic, e.Route}
		if rows[i].Long && !seen[k] {
			seen[k] = true
			where := "topic " + e.Topic
			if e.Route != "" {
				where += " (route " + e.Route + ")"
			}
			banners = append(banners, fmt.Sprintf("Messages of %s have been failing for %s: %s", where, age(failing), oneLine(e.Error, 200)))
		}
	}
	slices.SortStableFunc(rows, func(a, b retryErrorRow) int {
		if a.Long != b.Long { // the long failures first
			if a.Long {
				return -1
			}
			return 1
		}
		return 0
	})
	return rows, banners
}

// oneLine folds s onto one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}

func (c *Console) uiOverview(w http.ResponseWriter, r *http.Request) {
	src := c.src(r)
	if src == nil {
		c.uiSummary(w, r)
		return
	}
	st, err := c.status(r)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	series, span := src.Samples.series()
	var rows []topicRow
	tbl := toTable(st.Topics, "topic")
	for i, t := range st.Topics {
		var pending, lag []int64
		for _, p := range series[t.Topic] {
			pending = append(pending, p.Pending)
			lag = append(lag, int64(p.OldestAge))
		}
		tr := topicRow{Topic: t.Topic, Backlog: table{Columns: tbl.Columns, Rows: [][]any{tbl.Rows[i]}}}
		if src.Samples != nil {
			tr.Spark = sparkline(pending)
			tr.LagSpark = spark(lag, "oldest pending age", func(v int64, _ int) string { return age(time.Duration(v)) })
			if len(pending) > 1 {
				tr.Drawn = true
				tr.Peak = slices.Max(pending)
				tr.PeakLag = age(time.Duration(slices.Max(lag)))
			}
		}
		rows = append(rows, tr)
	}
	totals := toTable([]operator.Backlog{st.Backlog})
	// Lanes nobody works, counted for the routes some relay serves: a
	// route no relay runs (the default route beside a routes table) has
	// all its lanes unworked and nothing to say about the relays.
	unworked := 0
	for _, l := range st.Lanes {
		if l.Relays > 0 {
			unworked += l.Unworked
		}
	}
	health, banners := routeHealth(st.Status)
	errs, retryBanners := c.retryErrors(st.Status)
	banners = append(banners, retryBanners...)
	if grew, over := src.Samples.deadGrowth(); grew > 0 {
		noun := "dead letters"
		if grew == 1 {
			noun = "dead letter"
		}
		banners = append(banners, fmt.Sprintf("%d new %s in the last %s: see the dead letters page.", grew, noun, age(over)))
	}
	spanText := ""
	if span > 0 {
		spanText = age(span)
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", struct {
		Status   statusView
		Totals   table
		Columns  []string
		Topics   []topicRow
		Sampled  bool
		Span     string
		Dead     table
		Unworked int
		Errors   []retryErrorRow
		Banners  []string
		Health   []routeHealthRow
	}{st, totals, tbl.Columns, rows, src.Samples != nil, spanText, toTable(st.DeadByReason), unworked, errs, banners, health})
}

// filterForm is the dead-letter filter as the form shows it.
type filterForm struct {
	Topic, Key, Reason, Route, DeadAfter, DeadBefore string
}

func formOf(q url.Values) filterForm {
	return filterForm{Topic: q.Get("topic"), Key: q.Get("key"), Reason: q.Get("reason"), Route: q.Get("route"),
		DeadAfter: q.Get("dead_after"), DeadBefore: q.Get("dead_before")}
}

// query is the filter as a query string (for links to the next page and
// to the confirmations).
func (f filterForm) Query() template.URL {
	q := url.Values{}
	for k, v := range map[string]string{"topic": f.Topic, "key": f.Key, "reason": f.Reason, "route": f.Route,
		"dead_after": f.DeadAfter, "dead_before": f.DeadBefore} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return template.URL(q.Encode())
}

// Empty reports whether the filter selects every dead letter.
func (f filterForm) Empty() bool { return f == filterForm{} }

func (c *Console) uiDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, _, err := c.listPage(r, q)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	f := formOf(q)
	next := ""
	if p.NextCursor != "" {
		nq, _ := url.ParseQuery(string(f.Query()))
		nq.Set("cursor", p.NextCursor)
		next = "?" + nq.Encode()
	}
	c.render(w, r, http.StatusOK, "deadletters", "Dead letters", struct {
		Filter filterForm
		Page   page
		Next   template.URL
	}{f, p, template.URL(next)})
}

// payloadView shows a payload as indented JSON when it is JSON, as text
// when it is UTF-8, and always as a hex dump.
type payloadView struct {
	JSON string
	Text string
	Hex  string
	Size int
}

// maxHex bounds the hex dump of a payload (four times its size in HTML).
const maxHex = 16 << 10

func viewPayload(b []byte) payloadView {
	v := payloadView{Size: len(b), Hex: hex.Dump(b[:min(len(b), maxHex)])}
	if len(b) > maxHex {
		v.Hex += fmt.Sprintf("… %d more bytes (the API's GET /api/v1/dead-letters/{id} has them all)\n", len(b)-maxHex)
	}
	var out bytes.Buffer
	if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		v.JSON = out.String()
	} else if isText(b) {
		v.Text = string(b)
	}
	return v
}

func isText(b []byte) bool {
	s := string(b)
	return !strings.ContainsFunc(s, func(r rune) bool { return r == '\uFFFD' || (r < 0x20 && r != '\n' && r != '\t' && r != '\r') })
}

type deadLetterView struct {
	operator.DeadLetter
	Payload payloadView
	Headers [][2]string
}

func (c *Console) uiDeadLetter(w http.ResponseWriter, r *http.Request) {
	id, dls, ok := c.deadLettersOf(w, r)
	if !ok {
		return
	}
	views := make([]deadLetterView, len(dls))
	for i, d := range dls {
		views[i] = deadLetterView{DeadLetter: d, Payload: viewPayload(d.Payload)}
		for k, v := range d.Headers {
			views[i].Headers = append(views[i].Headers, [2]string{k, v})
		}
		slices.SortFunc(views[i].Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	}
	c.render(w, r, http.StatusOK, "deadletter", fmt.Sprintf("Dead letter %d", id), struct {
		ID    int64
		Views []deadLetterView
	}{id, views})
}

// confirmation is what a replay or purge would do, shown before it is
// done: the count comes from a dry run.
type confirmation struct {
	Action  string
	Filter  filterForm
	IDs     string
	All     bool
	Count   int64
	Skipped []operator.ReplayedDeadLetter
	Fields  [][2]string
}

func (c *Console) uiConfirm(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	action := q.Get("action")
	if action != "replay" && action != "purge" {
		c.fail(w, r, http.StatusBadRequest, "action: want replay or purge")
		return
	}
	s, err := selectorFromQuery(q)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	cf := confirmation{Action: action, Filter: formOf(q), IDs: strings.Join(q["id"], ","), All: s.All}
	// The preview is a read: a dry run, audited as one, under the name of
	// whoever may read.
	if action == "replay" {
		res, err := c.replay(r, "(preview)", s, true, false)
		if err != nil {
			c.failErr(w, r, err)
			return
		}
		cf.Count = int64(res.Count)
		for _, d := range res.DeadLetters {
			if d.Outcome == operator.ReplaySkipped {
				cf.Skipped = append(cf.Skipped, d)
			}
		}
	} else {
		if cf.Count, err = c.purge(r, "(preview)", s, true); err != nil {
			c.failErr(w, r, err)
			return
		}
	}
	for _, k := range []string{"id", "topic", "key", "reason", "route", "dead_after", "dead_before", "older_than", "all"} {
		v := q.Get(k)
		if k == "id" {
			v = strings.Join(q[k], ",")
		}
		if v != "" {
			cf.Fields = append(cf.Fields, [2]string{k, v})
		}
	}
	c.render(w, r, http.StatusOK, "confirm", "Confirm "+action, cf)
}

// uiAct replays or purges from the confirmation form. The token comes in
// the form (the console sets no cookie, so a page of another site cannot
// make a browser act: it does not know the token).
func (c *Console) uiAct(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		status := http.StatusBadRequest
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			status = http.StatusRequestEntityTooLarge
		}
		c.fail(w, r, status, "form: "+err.Error())
		return
	}
	action := r.PathValue("action")
	if action != "replay" && action != "purge" {
		c.fail(w, r, http.StatusNotFound, "no such action: "+action)
		return
	}
	secret := r.PostForm.Get("token")
	who, ok := c.authorize(w, r, secret, secret != "")
	if !ok {
		return
	}
	// A mutation names its source: without one, it is refused (400)
	// while there are several, as the API's are.
	if r, ok = c.resolve(w, r, r.Form.Get("source")); !ok {
		return
	}
	s, err := selectorFromQuery(r.PostForm)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	var n int64
	var skipped []operator.ReplayedDeadLetter
	if action == "replay" {
		res, err := c.replay(r, who, s, false, r.PostForm.Get("clear_conflicting_dedup_keys") == "on")
		if err != nil {
			c.failErr(w, r, err)
			return
		}
		n = int64(res.Count)
		for _, d := range res.DeadLetters {
			if d.Outcome == operator.ReplaySkipped {
				skipped = append(skipped, d)
			}
		}
	} else if n, err = c.purge(r, who, s, false); err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "done", strings.ToUpper(action[:1])+action[1:]+" done", struct {
		Action  string
		Count   int64
		Skipped []operator.ReplayedDeadLetter
		Token   string
	}{action, n, skipped, who})
}

func (c *Console) uiRelays(w http.ResponseWriter, r *http.Request) {
	st, err := c.status(r)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "relays", "Relays and lanes", struct {
		Status statusView
		Relays table
		Lanes  table
		FanOut table
	}{st, toTable(st.Relays, "started_at", "heartbeat_at"), toTable(st.Lanes), toTable(st.FanOut)})
}

func (c *Console) uiRoutes(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "routes", "Routes and sinks", c.src(r).Routes)
}
