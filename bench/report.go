package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// row is one line of the results: a workload, its parameters and its
// median over runs.
type row struct {
	Group        string    `json:"group"`
	Name         string    `json:"name"`
	Messages     int       `json:"messages"`
	PayloadBytes int       `json:"payload_bytes"`
	Keys         int       `json:"keys"`
	Batch        int       `json:"batch_size,omitempty"`
	Workers      int       `json:"workers_per_process,omitempty"`
	Processes    int       `json:"processes,omitempty"`
	Runs         int       `json:"runs"`
	Rates        []float64 `json:"rates_per_run,omitempty"`
	Rate         float64   `json:"median_rate,omitempty"` // messages/s
	Ratio        float64   `json:"ratio_to_raw_sql,omitempty"`
	RatioBest    float64   `json:"ratio_to_best_raw_sql_run,omitempty"`
	// Yardstick names the row of this sink's own limit in the same run;
	// YardRatio is Rate over that row's rate.
	Yardstick  string    `json:"yardstick,omitempty"`
	YardRatio  float64   `json:"ratio_to_yardstick,omitempty"`
	RSS        []float64 `json:"peak_rss_mib_per_run,omitempty"`
	PeakRSSMiB float64   `json:"peak_rss_mib,omitempty"`
	// Latency rows (milliseconds, median over runs of each percentile).
	TargetRate float64     `json:"target_rate,omitempty"`
	Lat        [][]float64 `json:"latency_ms_per_run,omitempty"` // p50,p95,p99,max
	P50        float64     `json:"p50_ms,omitempty"`
	P95        float64     `json:"p95_ms,omitempty"`
	P99        float64     `json:"p99_ms,omitempty"`
	Max        float64     `json:"max_ms,omitempty"`
	OrderOK    string      `json:"per_key_order,omitempty"`
	Mode       string      `json:"mode,omitempty"`
	Note       string      `json:"note,omitempty"`
	// Live rows (live.go).
	Live *liveStats `json:"live,omitempty"`
	// Rows of the sources group (sources.go, sourceslat.go).
	SrcIdle *srcIdleStats `json:"sources_idle,omitempty"`
	SrcLat  *srcLatStats  `json:"sources_latency,omitempty"`
}

func (r *row) addRun(rate, rss float64) {
	r.Rates = append(r.Rates, rate)
	if rss > 0 {
		r.RSS = append(r.RSS, rss)
	}
}

func (r *row) addNote(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += s
}

func (r *row) finish() {
	r.Runs = max(len(r.Rates), len(r.Lat))
	r.Rate = median(r.Rates)
	if len(r.RSS) > 0 {
		r.PeakRSSMiB = slices.Max(r.RSS)
	}
	if len(r.Lat) > 0 {
		col := func(i int) float64 {
			var v []float64
			for _, l := range r.Lat {
				v = append(v, l[i])
			}
			return median(v)
		}
		r.P50, r.P95, r.P99, r.Max = col(0), col(1), col(2), col(3)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

type report struct {
	Started  string            `json:"started"`
	Duration string            `json:"duration"`
	Mode     string            `json:"mode"`
	Command  string            `json:"command"`
	Machine  map[string]string `json:"machine"`
	RawRate  float64           `json:"raw_sql_rate"`
	RawBest  float64           `json:"raw_sql_best_run"`
	Rows     []*row            `json:"rows"`
}

func (rep *report) add(r *row) {
	switch {
	case r.Group == "writertax" || r.Group == "idle" || r.Group == "live" || r.Group == "sources":
		// Divided by the plain table of the same run (writertax.go).
	case rep.RawRate > 0 && r.Rate > 0 && !strings.HasPrefix(r.Name, "raw SQL"):
		r.Ratio = r.Rate / rep.RawRate
		r.RatioBest = r.Rate / rep.RawBest
	case strings.HasPrefix(r.Name, "raw SQL"):
		r.Ratio = 1
		r.RatioBest = r.Rate / rep.RawBest
	}
	rep.Rows = append(rep.Rows, r)
}

func (rep *report) json() ([]byte, error) { return json.MarshalIndent(rep, "", "  ") }

func fmtRate(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtRatio(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtMS(v float64) string {
	if v == 0 || math.IsNaN(v) {
		return "–"
	}
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func (rep *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# outbox-relay benchmark (%s mode)\n\n", rep.Mode)
	fmt.Fprintf(&b, "Started %s, took %s. Command: `%s`.\n\n", rep.Started, rep.Duration, rep.Command)
	keys := make([]string, 0, len(rep.Machine))
	for k := range rep.Machine {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("Machine:")
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=`%s`;", k, rep.Machine[k])
	}
	b.WriteString("\n\n")
	if rep.RawRate > 0 {
		fmt.Fprintf(&b, "Raw-SQL yardstick in this run: **%.0f msg/s** (median; best run %.0f). Every \"× raw\" figure divides by the median; \"× best raw\" by the best run, which is the better yardstick when other sessions disturbed some runs (see the raw row's runs).\n\n", rep.RawRate, rep.RawBest)
	}

	groups := []struct{ id, title, target string }{
		{"drain", "Backlog drain", "Targets: discard ≥ 0.90 × raw SQL; Kafka ≥ 0.90 × the plain unordered pipeline and ≥ 0.60 × raw SQL; RabbitMQ ≥ 0.80 × the raw amqp091-go publisher; HTTP ≥ 0.70 × the raw net/http client; fan-out to two routes ≥ 0.50 × the plain discard drain; one hot key ≥ 0.50 × raw SQL. \"× own yardstick\" divides a relay row by its sink's yardstick row of the same run."},
		{"writertax", "Writer tax (what the outbox costs the application's commits)", "Target: 16 writers into the outbox with one relay draining ≥ 0.70 × the same writers into a plain table with no relay."},
		{"idle", "Idle cost", "Targets: 16 idle relays ≤ 50 database transactions/s in all; the first message after 60 s of idleness arrives within 10 ms."},
		{"latency", "Steady-state latency (commit returned in the writer → request received by the webhook receiver, or record fetched by an independent Kafka consumer)", "Targets: p99 ≤ 10 ms at 50/s and 1,000/s, HTTP and Kafka, with the writers keeping up (commits/s achieved = offered); p99 ≤ 25 ms at 5,000/s."},
		{"scaling", "Scaling (relay processes started and lane-balanced on an empty outbox; backlog committed in one transaction; time to empty)", "Target: aggregate throughput never below one process."},
		{"together", "Relays started together on a full backlog (clock from the processes' start; default lease settings)", "Target: N = 2, 4, 16 each ≥ 0.9 × one relay of the same binary in the same run (see each row's note); rebalance ≤ 200 ms."},
		{"live", "Live rates: one relay (binary, default settings) at the rates services run, against its own 100k drain in the same run", "Targets (issue 36): at 1,000 msg/s relay CPU and database-session CPU per message each ≤ 6 × the drain's per-message cost, p99 ≤ 10 ms; at 100 msg/s each ≤ 40 ×, p99 ≤ 10 ms; idle ≤ 0.01 of a core each. CPU from /proc: the relay process, and its database backends (application_name outbox-relay*); transactions from pg_stat_database of a database of the group's own, the writers' commits and the bench's own queries taken out; batches from the relay's /metrics (claims that returned rows; empty claims and wake-ups are not exported). Targets (issue 49): at 1,000 msg/s relay + DB CPU per message ≤ 2 × floor A's, DB ≤ 1.5 × floor A's, own statements ≤ 0.5 a message; at 100 msg/s ≤ 1.5 × floor B's, own statements ≤ 1.5 a message. \"× floor\" divides by the floor row of the same set and rate: floor A (a raw poll loop) where the relay polls, floor B (a logical-replication reader) where it follows the WAL, and there floor A of the polling set on the same server too. Own statements: pg_stat_statements calls of the database less the writers' (3 a commit) and the bench's own."},
		{"peers", "Peers (same Postgres, same message count and size)", "Target: faster than every peer."},
		{"sources", "Many sources: one relay process with a sources list (`--wakeup poll`, throwaway clusters)", "Targets: an idle source ≤ 0.002 of a core of relay CPU, over 50 idle sources in one process (the first table: three processes idle at once over the same windows; \"per source\" divides by the sources, \"× single\" by the single relay's figure); a 200k backlog in one source, or its database stopped, does not raise the other sources' commit → webhook p99 above 2 × their p99 alone (the second table: one process, 3 quiet sources at 100 msg/s each and a 4th, all into the HTTP sink; the control row drains the backlog in a second process, to tell the shared cores from the shared process)."},
		{"brokers", "NATS JetStream and Redis Streams against their raw publishers (alternating raw, relay per run; the relay rows' notes give the ratio)", "Target: ≥ 0.8 × the raw publisher."},
	}
	for _, g := range groups {
		var rs []*row
		for _, r := range rep.Rows {
			if r.Group == g.id {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", g.title, g.target)
		switch g.id {
		case "writertax":
			taxTable(&b, rs)
		case "idle":
			b.WriteString("| workload | relays | database tx/s | first message after idle, ms | notes |\n|---|---|---|---|---|\n")
			for _, r := range rs {
				fmt.Fprintf(&b, "| %s | %d | %.1f | %s | %s |\n", r.Name, r.Processes, r.Rate, fmtMS(r.P50), orDash(r.Note))
			}
		case "live":
			liveTable(&b, rs)
		case "sources":
			sourcesTable(&b, rs)
		case "latency":
			b.WriteString("| workload | messages/run | payload B | keys | batch | workers × procs | runs | commits/s achieved | p50 ms | p95 ms | p99 ms | max ms | notes |\n")
			b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			for _, r := range rs {
				fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d × %d | %d | %s | %s | %s | %s | %s | %s |\n",
					r.Name, r.Messages, r.PayloadBytes, r.Keys, r.Batch, r.Workers, r.Processes, r.Runs,
					fmtRate(r.Rate), fmtMS(r.P50), fmtMS(r.P95), fmtMS(r.P99), fmtMS(r.Max), orDash(r.Note))
			}
		default:
			b.WriteString("| workload | messages | payload B | keys | batch | workers × procs | runs | median msg/s | × raw SQL | × best raw | × own yardstick | runs msg/s | peak RSS MiB | per-key order | mode | notes |\n")
			b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			for _, r := range rs {
				var runs []string
				for _, v := range r.Rates {
					runs = append(runs, fmt.Sprintf("%.0f", v))
				}
				rss := "–"
				if r.PeakRSSMiB > 0 {
					rss = fmt.Sprintf("%.0f", r.PeakRSSMiB)
				}
				wp := "–"
				if r.Workers > 0 {
					wp = fmt.Sprintf("%d × %d", r.Workers, r.Processes)
				}
				batch := "–"
				if r.Batch > 0 {
					batch = fmt.Sprint(r.Batch)
				}
				keys := "none"
				if r.Keys > 0 {
					keys = fmt.Sprint(r.Keys)
				}
				fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
					r.Name, r.Messages, r.PayloadBytes, keys, batch, wp, r.Runs, fmtRate(r.Rate), fmtRatio(r.Ratio), fmtRatio(r.RatioBest), fmtRatio(r.YardRatio),
					orDash(strings.Join(runs, ", ")), rss, orDash(r.OrderOK), orDash(r.Mode), orDash(r.Note))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// liveTable writes the live rows, one table per set of rows (livewal.go),
// in the order the sets first appear.
func liveTable(b *strings.Builder, rs []*row) {
	var sets []string
	bySet := map[string][]*row{}
	for _, r := range rs {
		set := ""
		if r.Live != nil {
			set = r.Live.Set
		}
		if _, ok := bySet[set]; !ok {
			sets = append(sets, set)
		}
		bySet[set] = append(bySet[set], r)
	}
	for i, set := range sets {
		if i > 0 {
			b.WriteString("\n")
		}
		if set != "" {
			fmt.Fprintf(b, "**On a %s** (the same rows; the relay's own yardstick drain of this set):\n\n", set)
		} else if len(sets) > 1 {
			b.WriteString("**On the shared server (DATABASE_URL), the relay's default --wakeup auto:**\n\n")
		}
		liveSetTable(b, bySet[set])
	}
}

func liveSetTable(b *strings.Builder, rs []*row) {
	b.WriteString("| sink | load | msg/s delivered | relay CPU µs/msg | DB sessions CPU µs/msg | × drain (relay / DB) | × floor (relay+DB / DB) | relay cores | DB cores | relay tx/msg | relay tx/s | statements/msg | own statements/msg | batches/msg | DB sessions | p50 ms | p99 ms | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	us := func(v float64) string {
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", v)
	}
	per := func(v float64) string {
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("%.3g", v)
	}
	for _, r := range rs {
		l := r.Live
		if l == nil {
			fmt.Fprintf(b, "| %s | – | – | – | – | – | – | – | – | – | – | – | – | – | – | – | – | %s |\n", r.Name, orDash(r.Note))
			continue
		}
		x := "1 (yardstick)"
		switch {
		case l.RelayX > 0 || l.DBX > 0:
			x = fmt.Sprintf("**%.0f× / %.0f×**", l.RelayX, l.DBX)
		case l.Offered == 0 && l.Messages == 0:
			x = "–"
		}
		fx := "–"
		if l.Floor != "" {
			fx = "1 (floor " + l.Floor + ")"
		}
		var fxs []string
		for _, f := range l.VsFloors {
			s := fmt.Sprintf("**%.2f× / %.2f×** floor %s", f.X, f.DBX, f.Floor)
			if f.Set != "" {
				s += " (of the polling set, same server)"
			}
			fxs = append(fxs, s)
		}
		if len(fxs) > 0 {
			fx = strings.Join(fxs, "; ")
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %.3f | %.3f | %s | %.1f | %s | %s | %s | %d | %s | %s | %s |\n",
			l.Sink, l.Load, fmtRate(l.Achieved), us(l.RelayCPUUs), us(l.DBCPUUs), x, fx, l.RelayCores, l.DBCores,
			per(l.TxPerMsg), l.TxPerS, per(l.StmtPerMsg), per(l.OwnStmtPerMsg), per(l.BatchesPerMsg), l.DBSessions, fmtMS(r.P50), fmtMS(r.P99), orDash(r.Note))
	}
}

// sourcesTable writes the sources group's idle rows, then its latency
// rows.
func sourcesTable(b *strings.Builder, rs []*row) {
	var idle, lat, other []*row
	for _, r := range rs {
		switch {
		case r.SrcIdle != nil:
			idle = append(idle, r)
		case r.SrcLat != nil:
			lat = append(lat, r)
		default:
			other = append(other, r)
		}
	}
	x := func(v float64) string {
		if v == 0 {
			return "1 (yardstick)"
		}
		return fmt.Sprintf("**%.2f×**", v)
	}
	if len(idle) > 0 {
		b.WriteString("| idle relay | sources | relay cores | per source | × single | DB sessions cores | per source | × single | DB sessions (per source) | database tx/s | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range idle {
			st := r.SrcIdle
			n, srcs := max(st.Sources, 1), "–"
			if st.Sources > 0 {
				srcs = fmt.Sprint(st.Sources)
			}
			fmt.Fprintf(b, "| %s | %s | %.4f | **%.4f** | %s | %.4f | %.4f | %s | %d (%.1f) | %.1f | %s |\n", r.Name, srcs,
				st.RelayCores, st.PerSource, x(st.XSingle), st.DBCores, st.DBPerSource, x(st.DBXSingle), st.Sessions,
				float64(st.Sessions)/float64(n), st.TxPerS, orDash(r.Note))
		}
		b.WriteString("\n")
	}
	if len(lat) > 0 {
		b.WriteString("| quiet sources' latency | runs | messages/run | msg/s achieved | p50 ms | p95 ms | p99 ms | max ms | p99 × alone (per run) | notes |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range lat {
			xa := "1 (yardstick)"
			if r.SrcLat.Case != "alone" {
				xa = fmt.Sprintf("**%.2f×** (%s)", r.SrcLat.XAlone, fmtList(r.SrcLat.XAloneRuns, "%.2f"))
			}
			fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", r.Name, r.Runs, r.Messages, fmtRate(r.Rate),
				fmtMS(r.P50), fmtMS(r.P95), fmtMS(r.P99), fmtMS(r.Max), xa, orDash(r.Note))
		}
		b.WriteString("\n")
	}
	for _, r := range other {
		fmt.Fprintf(b, "%s: %s\n\n", r.Name, orDash(r.Note))
	}
}
