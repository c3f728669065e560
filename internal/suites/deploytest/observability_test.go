package deploytest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { relaybin.Main(m) }

const (
	alertsFile    = "deploy/prometheus/alerts.yaml"
	alertTests    = "deploy/prometheus/alerts_test.yaml"
	dashboardFile = "deploy/grafana/outbox-relay.json"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		unavailable(t, "promtool not found (Debian package prometheus; scripts/services.sh promtool installs it)")
	}
	return p
}

// The alert rules load, and their unit tests (deploy/prometheus/
// alerts_test.yaml: each alert fires when it should and not before)
// pass.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	pt := promtool(t)
	dir := filepath.Join(root(t), "deploy", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(pt, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}

	// The compose stack's Prometheus configuration, with the rules where
	// the stack mounts them.
	conf := strings.Replace(string(readFile(t, "deploy/compose/prometheus/prometheus.yml")),
		"/etc/prometheus/rules/alerts.yaml", filepath.Join(dir, "alerts.yaml"), 1)
	f := filepath.Join(t.TempDir(), "prometheus.yml")
	require.NoError(t, os.WriteFile(f, []byte(conf), 0o600))
	out, err := exec.Command(pt, "check", "config", f).CombinedOutput()
	require.NoError(t, err, "promtool check config (deploy/compose/prometheus/prometheus.yml):\n%s", out)
}

// dashboard is the part of a Grafana dashboard this test reads.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var d dashboard
	require.NoError(t, json.Unmarshal(readFile(t, dashboardFile), &d))
	require.Equal(t, "outbox-relay", d.UID)
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, "panel %q has no data source", p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q does not use the dashboard's data source variable", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q has an empty query", p.Title)
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// The dashboard's queries are valid PromQL: promtool checks them as the
// expressions of recording rules (Grafana's variables replaced by what
// they expand to).
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	pt := promtool(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range dashboardExprs(t) {
		e = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$source", ".*", "$route", ".*").Replace(e)
		q, err := json.Marshal(e)
		require.NoError(t, err)
		fmt.Fprintf(&b, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
	}
	f := filepath.Join(t.TempDir(), "dashboard_rules.yaml")
	require.NoError(t, os.WriteFile(f, []byte(b.String()), 0o600))
	out, err := exec.Command(pt, "check", "rules", f).CombinedOutput()
	require.NoError(t, err, "a dashboard query is not valid PromQL:\n%s", out)
}

var metricName = regexp.MustCompile(`\boutbox_relay_[a-z0-9_]+`)

// Every metric the dashboard and the alert rules query is one a running
// relay exports: the test runs the relay binary against real Postgres and
// a webhook that accepts, retries and refuses messages, then reads its
// /metrics, once for a database and once with a sources list (which adds
// the outbox_relay_source_ metrics). (Grafana itself cannot be installed
// here; this is what stands for it.)
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := liveMetrics(t, false)
	maps.Copy(exported, liveMetrics(t, true))
	used := map[string][]string{}
	for _, e := range dashboardExprs(t) {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = append(used[m], dashboardFile)
		}
	}
	for _, m := range metricName.FindAllString(string(readFile(t, alertsFile)), -1) {
		used[m] = append(used[m], alertsFile)
	}
	require.NotEmpty(t, used)
	for m, where := range used {
		require.True(t, exported[m], "%s queries %s, which the relay does not export (it exports %v)", slices.Compact(where), m, keys(exported))
	}
	t.Logf("%d metric names queried, all exported", len(used))
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// liveMetrics runs `outbox-relay run` with its admin listener and returns
// the sample names of its /metrics once it has delivered, retried and
// dead-lettered messages; with sources, from a sources list of one
// source instead of --database-url.
func liveMetrics(t *testing.T, sources bool) map[string]bool {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	var calls atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n := calls.Add(1); {
		case r.URL.Path == "/hook/refused":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	defer hook.Close()

	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Sprint("k", i%4), Payload: []byte(`{}`)})
	}
	msgs = append(msgs, outbox.Message{Topic: "refused", Key: "x", Payload: []byte(`{}`)})
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	conf := fmt.Sprintf(`routes:
  - name: orders
    topics: ["orders"]
    sink: %s/hook/orders
  - name: refused
    topics: ["refused"]
    sink: %s/hook/refused
    on-dead-letter: hold
http:
  allow_insecure_http: true
`, hook.URL, hook.URL)
	// No database URL beside a sources list: the relay refuses both.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "DATABASE_URL") || strings.HasPrefix(kv, "OUTBOX_DATABASE_URL")
	})
	if sources {
		conf += fmt.Sprintf("sources:\n  - name: main\n    database-url: %q\n", pgtest.URL())
	} else {
		env = append(env, "DATABASE_URL="+pgtest.URL())
	}
	require.NoError(t, os.WriteFile(cfg, []byte(conf), 0o600))
	cmd := exec.Command(relaybin.Binary(t), "run", "--config", cfg, "--schema", schema, "--admin-addr", addr,
		"--retry-initial", "10ms", "--poll-interval", "50ms", "--metrics-interval", "200ms")
	cmd.Env = env
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	}()

	var names map[string]bool
	testkit.Eventually(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
		var pending, dead int
		// The refused route holds its key: its dead letter stays parked
		// (held_since set), which is not pending.
		if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+migrations.Ident(schema)+".messages WHERE held_since IS NULL"+"), (SELECT count(*) FROM "+migrations.Ident(schema)+".dead_letters"+")").Scan(&pending, &dead); err != nil {
			return false, err.Error()
		}
		if pending > 0 || dead == 0 {
			return false, fmt.Sprintf("%d pending, %d dead letters", pending, dead)
		}
		names = scrape(t, "http://"+addr+"/metrics")
		return names["outbox_relay_dead_letters"] && names["outbox_relay_delivery_latency_seconds_bucket"] && names["outbox_relay_held_keys"], "backlog gauges not refreshed yet"
	})
	return names
}

func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		names[name] = true
	}
	return names
}
