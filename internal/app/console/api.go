package console

import (
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// apiError is every error the API answers.
type apiError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // "<token>" reads better than "\u003ctoken\u003e"; the answer is JSON, never HTML
	_ = enc.Encode(v)
}

// fail answers an error: JSON for the API, a page for the UI.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if strings.HasPrefix(r.URL.Path, "/ui") {
		c.uiError(w, r, status, msg)
		return
	}
	writeJSON(w, status, apiError{Error: msg})
}

// failErr answers err: 400 for what the request got wrong, 404 for an
// unknown dead letter, 500 (logged) for the rest.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, err error) {
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		c.fail(w, r, http.StatusBadRequest, err.Error())
	case errors.Is(err, operator.ErrEmptySelection), errors.Is(err, operator.ErrReplayRoute),
		errors.Is(err, operator.ErrUnknownReason), errors.Is(err, operator.ErrConflictingRoutes):
		c.fail(w, r, http.StatusBadRequest, err.Error())
	case errors.Is(err, operator.ErrNotFound):
		c.fail(w, r, http.StatusNotFound, err.Error())
	case r.Context().Err() != nil:
		c.fail(w, r, http.StatusServiceUnavailable, "request cancelled: "+err.Error())
	default:
		c.log.Error("console: request failed", append(c.sourceAttrs(r), "method", r.Method, "path", r.URL.Path, "error", err)...)
		c.fail(w, r, http.StatusInternalServerError, err.Error())
	}
}

// badRequest is an error in what the client sent.
type badRequest struct{ msg string }

func (b badRequest) Error() string { return b.msg }

func badf(format string, args ...any) error { return badRequest{fmt.Sprintf(format, args...)} }

// selector is the dead-letter selector of the API's mutations (JSON) and
// of the list's query string.
type selector struct {
	IDs    []int64 `json:"ids,omitempty"`
	Topic  string  `json:"topic,omitempty"`
	Key    string  `json:"key,omitempty"`
	Reason string  `json:"reason,omitempty"`
	// Route is a pointer so that "" (the default route: the outbox's own
	// dead letters) is told apart from no route at all.
	Route      *string    `json:"route,omitempty"`
	DeadAfter  *time.Time `json:"dead_after,omitempty"`
	DeadBefore *time.Time `json:"dead_before,omitempty"`
	OlderThan  string     `json:"older_than,omitempty"`
	All        bool       `json:"all,omitempty"`
}

func (s selector) selection() (operator.Selection, error) {
	sel := operator.Selection{Topic: s.Topic, Key: s.Key, Reason: s.Reason, All: s.All}
	if s.Route != nil {
		sel.Route, sel.DefaultRoute = *s.Route, *s.Route == ""
	}
	if len(s.IDs) > MaxIDs {
		return sel, badf("ids: at most %d", MaxIDs)
	}
	for _, id := range s.IDs {
		if id <= 0 {
			return sel, badf("ids: %d is not a positive integer", id)
		}
	}
	sel.IDs = s.IDs
	if s.DeadAfter != nil {
		sel.DeadAfter = *s.DeadAfter
	}
	if s.DeadBefore != nil {
		sel.DeadBefore = *s.DeadBefore
	}
	if s.OlderThan != "" {
		d, err := time.ParseDuration(s.OlderThan)
		if err != nil || d <= 0 {
			return sel, badf("older_than: %q is not a positive duration such as 720h", s.OlderThan)
		}
		sel.OlderThan = d
	}
	return sel, nil
}

// parseTime reads a time as RFC 3339, or as an HTML datetime-local value
// (2006-01-02T15:04, read as UTC).
func parseTime(name, v string) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return &t, nil
		}
	}
	return nil, badf("%s: %q is not a time (RFC 3339, e.g. 2026-01-02T15:04:05Z)", name, v)
}

// selectorFromQuery reads a selector from a query string or a form.
func selectorFromQuery(q url.Values) (selector, error) {
	s := selector{Topic: q.Get("topic"), Key: q.Get("key"), Reason: q.Get("reason"), OlderThan: q.Get("older_than")}
	// In a query string (and the UI's filter form, which sends every
	// field) an empty route does not filter.
	if r := q.Get("route"); r != "" {
		s.Route = &r
	}
	for _, raw := range q["id"] {
		for _, part := range strings.Split(raw, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			id, err := strconv.ParseInt(part, 10, 64)
			if err != nil || id <= 0 {
				return s, badf("id: %q is not a positive integer", part)
			}
			s.IDs = append(s.IDs, id)
		}
	}
	var err error
	if s.DeadAfter, err = parseTime("dead_after", q.Get("dead_after")); err != nil {
		return s, err
	}
	if s.DeadBefore, err = parseTime("dead_before", q.Get("dead_before")); err != nil {
		return s, err
	}
	switch q.Get("all") {
	case "", "false", "0":
	case "true", "1", "on":
		s.All = true
	default:
		return s, badf("all: %q is not true or false", q.Get("all"))
	}
	return s, nil
}

// cursor is the position after a page's last dead letter.
type cursor struct {
	ID    int64  `json:"id"`
	Route string `json:"route"`
}

func (k cursor) encode() string {
	b, _ := json.Marshal(k)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var k cursor
	if s == "" {
		return k, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &k) != nil || k.ID < 0 {
		return k, badf("cursor: %q is not a cursor this API returned", s)
	}
	return k, nil
}

// page is one page of dead letters.
type page struct {
	DeadLetters []operator.DeadLetter `json:"dead_letters"`
	// NextCursor fetches the next page; empty on the last.
	NextCursor string `json:"next_cursor,omitempty"`
}

// listPage reads the selection, page size and cursor of q and returns the
// page.
func (c *Console) listPage(r *http.Request, q url.Values) (page, selector, error) {
	s, err := selectorFromQuery(q)
	if err != nil {
		return page{}, s, err
	}
	sel, err := s.selection()
	if err != nil {
		return page{}, s, err
	}
	sel.Limit = operator.DefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return page{}, s, badf("limit: %q is not between 1 and %d", v, MaxPageSize)
		}
		sel.Limit = n
	}
	after, err := decodeCursor(q.Get("cursor"))
	if err != nil {
		return page{}, s, err
	}
	sel.AfterID, sel.AfterRoute = after.ID, after.Route
	rows, err := c.src(r).Admin.List(r.Context(), sel)
	if err != nil {
		return page{}, s, err
	}
	p := page{DeadLetters: rows}
	if len(rows) == sel.Limit {
		last := rows[len(rows)-1]
		p.NextCursor = cursor{ID: last.ID, Route: last.Route}.encode()
	}
	return p, s, nil
}

// statusView is the status with what the operator package leaves to its
// callers: heartbeat ages, the routes, and who answered.
type statusView struct {
	AnsweredBy Identity `json:"answered_by"`
	operator.Status
	Relays []relayView `json:"relays"`
	Routes []Route     `json:"routes"`
}

type relayView struct {
	operator.RelayStatus
	HeartbeatAge time.Duration `json:"heartbeat_age_ns"`
}

func (c *Console) status(r *http.Request) (statusView, error) {
	st, err := c.src(r).Admin.Status(r.Context())
	if err != nil {
		return statusView{}, err
	}
	v := statusView{AnsweredBy: c.cfg.Relay, Status: st, Relays: make([]relayView, len(st.Relays)), Routes: c.src(r).Routes}
	for i, rl := range st.Relays {
		v.Relays[i] = relayView{RelayStatus: rl, HeartbeatAge: since(st.Now, rl.HeartbeatAt)}
	}
	if v.Routes == nil {
		v.Routes = []Route{}
	}
	return v, nil
}

func (c *Console) apiStatus(w http.ResponseWriter, r *http.Request) {
	v, err := c.status(r)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (c *Console) apiList(w http.ResponseWriter, r *http.Request) {
	p, _, err := c.listPage(r, r.URL.Query())
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, badf("id: %q is not a positive integer", r.PathValue("id"))
	}
	return id, nil
}

// shown is a message's dead letters: one, or one per dead fan-out copy.
type shown struct {
	ID          int64                 `json:"id"`
	DeadLetters []operator.DeadLetter `json:"dead_letters"`
}

func (c *Console) apiShow(w http.ResponseWriter, r *http.Request) {
	id, dls, ok := c.deadLettersOf(w, r)
	if ok {
		writeJSON(w, http.StatusOK, shown{ID: id, DeadLetters: dls})
	}
}

// deadLettersOf reads the dead letters of the message the path names;
// when it cannot, it answers the request with the error and reports
// false.
func (c *Console) deadLettersOf(w http.ResponseWriter, r *http.Request) (int64, []operator.DeadLetter, bool) {
	id, err := pathID(r)
	if err != nil {
		c.failErr(w, r, err)
		return 0, nil, false
	}
	dls, err := c.src(r).Admin.Show(r.Context(), id)
	if err != nil {
		c.failErr(w, r, err)
		return 0, nil, false
	}
	return id, dls, true
}

// decode reads a JSON body strictly: unknown fields and trailing data are
// errors, and so is a body over MaxBodyBytes (413).
func (c *Console) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		c.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", tooBig.Limit))
		return false
	case err != nil:
		c.fail(w, r, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	return true
}

type replayRequest struct {
	selector
	DryRun                    bool `json:"dry_run,omitempty"`
	ClearConflictingDedupKeys bool `json:"clear_conflicting_dedup_keys,omitempty"`
}

// replayResponse counts the replayed dead letters (those that would be,
// in a dry run) and says what happened to each.
type replayResponse struct {
	DryRun      bool                          `json:"dry_run"`
	Count       int                           `json:"count"`
	Skipped     int                           `json:"skipped"`
	DeadLetters []operator.ReplayedDeadLetter `json:"dead_letters"`
}

func (c *Console) apiReplay(w http.ResponseWriter, r *http.Request, who string) {
	var req replayRequest
	if !c.decode(w, r, &req) {
		return
	}
	res, err := c.replay(r, who, req.selector, req.DryRun, req.ClearConflictingDedupKeys)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (c *Console) replay(r *http.Request, who string, s selector, dry, clearKeys bool) (replayResponse, error) {
	sel, err := s.selection()
	if err != nil {
		return replayResponse{}, err
	}
	res, err := c.src(r).Admin.Replay(r.Context(), sel, operator.ReplayOptions{DryRun: dry, ClearConflictingDedupKeys: clearKeys})
	if err != nil {
		c.audit(r, who, "replay", s, dry, -1, err)
		return replayResponse{}, err
	}
	out := replayResponse{DryRun: dry, DeadLetters: res.DeadLetters, Skipped: res.Count(operator.ReplaySkipped)}
	out.Count = len(res.DeadLetters) - out.Skipped
	if out.DeadLetters == nil {
		out.DeadLetters = []operator.ReplayedDeadLetter{}
	}
	c.audit(r, who, "replay", s, dry, int64(out.Count), nil, "skipped", out.Skipped)
	return out, nil
}

type purgeRequest struct {
	selector
	DryRun bool `json:"dry_run,omitempty"`
}

// countResponse is the answer of purge and archive replay.
type countResponse struct {
	DryRun bool  `json:"dry_run"`
	Count  int64 `json:"count"`
}

func (c *Console) apiPurge(w http.ResponseWriter, r *http.Request, who string) {
	var req purgeRequest
	if !c.decode(w, r, &req) {
		return
	}
	n, err := c.purge(r, who, req.selector, req.DryRun)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, countResponse{DryRun: req.DryRun, Count: n})
}

func (c *Console) purge(r *http.Request, who string, s selector, dry bool) (int64, error) {
	sel, err := s.selection()
	if err != nil {
		return 0, err
	}
	n, err := c.src(r).Admin.Purge(r.Context(), sel, dry)
	c.audit(r, who, "purge", s, dry, n, err)
	return n, err
}

type archiveRequest struct {
	From        *time.Time `json:"from,omitempty"`
	To          *time.Time `json:"to,omitempty"`
	FromAgo     string     `json:"from_ago,omitempty"`
	ToAgo       string     `json:"to_ago,omitempty"`
	Topic       string     `json:"topic,omitempty"`
	Route       string     `json:"route,omitempty"`
	NewIDs      bool       `json:"new_ids,omitempty"`
	ToRouteOnly bool       `json:"to_route_only,omitempty"`
	DryRun      bool       `json:"dry_run,omitempty"`
}

func (c *Console) apiArchiveReplay(w http.ResponseWriter, r *http.Request, who string) {
	var req archiveRequest
	if !c.decode(w, r, &req) {
		return
	}
	sel := operator.ArchiveSelection{Topic: req.Topic, Route: req.Route, NewIDs: req.NewIDs, ToRouteOnly: req.ToRouteOnly}
	if req.From != nil {
		sel.From = *req.From
	}
	if req.To != nil {
		sel.To = *req.To
	}
	for _, d := range []struct {
		name string
		raw  string
		to   *time.Duration
	}{{"from_ago", req.FromAgo, &sel.FromAgo}, {"to_ago", req.ToAgo, &sel.ToAgo}} {
		if d.raw == "" {
			continue
		}
		v, err := time.ParseDuration(d.raw)
		if err != nil || v <= 0 {
			c.failErr(w, r, badf("%s: %q is not a positive duration such as 24h", d.name, d.raw))
			return
		}
		*d.to = v
	}
	if sel.From.IsZero() && sel.FromAgo == 0 {
		c.failErr(w, r, badf("from or from_ago: required (the start of the range to replay, as the CLI's --from)"))
		return
	}
	n, err := c.src(r).Admin.ReplayArchive(r.Context(), sel, req.DryRun)
	c.auditArgs(r, who, "archive_replay", req, req.DryRun, n, err)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, countResponse{DryRun: req.DryRun, Count: n})
}

// audit writes the audit line of a mutation: on which source (when there
// are several), who (the token's name), what, on which selector, how many,
// and whether it was a dry run.
func (c *Console) audit(r *http.Request, who, action string, s selector, dry bool, n int64, err error, extra ...any) {
	c.auditArgs(r, who, action, s, dry, n, err, extra...)
}

func (c *Console) auditArgs(r *http.Request, who, action string, args any, dry bool, n int64, err error, extra ...any) {
	b, _ := json.Marshal(args)
	attrs := append(c.sourceAttrs(r), "action", action, "token", who, "selector", string(b), "dry_run", dry, "count", n, "remote", r.RemoteAddr)
	attrs = append(attrs, extra...)
	if err != nil {
		c.log.Warn("console audit: failed", append(attrs, "error", err)...)
		return
	}
	c.log.Info("console audit", attrs...)
}

//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the API's OpenAPI 3 document.
func OpenAPI() []byte { return openAPIDoc }

func (c *Console) openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPIDoc)
}
