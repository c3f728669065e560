package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/relay/operator"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the backlog per topic, dead letters and live relays",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.multiSource() {
				return g.statusOfSources(cmd.Context(), asJSON)
			}
			st, err := g.status(cmd.Context())
			if err != nil {
				return err
			}
			return show(g.stdout, asJSON, st, printStatus)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cliOnly(cmd)
}

// status reads the status of the command's outbox.
func (g *globals) status(ctx context.Context) (operator.Status, error) {
	pool, err := g.connect(ctx)
	if err != nil {
		return operator.Status{}, err
	}
	defer pool.Close()
	admin, err := operator.New(pool, g.schema)
	if err != nil {
		return operator.Status{}, &usageError{err}
	}
	return admin.Status(ctx)
}

func printStatus(out io.Writer, st operator.Status) {
	fmt.Fprintf(out, "pending %d (retrying %d), oldest %s, dead letters %d\n\n",
		st.Pending, st.Retrying, st.OldestAge.Round(time.Millisecond), st.DeadLetters)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPENDING\tRETRYING\tOLDEST\tDEAD")
	for _, t := range st.Topics {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\n", t.Topic, t.Pending, t.Retrying, t.OldestAge.Round(time.Millisecond), t.DeadLetters)
	}
	_ = tw.Flush()
	printRetryErrors(out, st)
	if len(st.DeadByReason) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(tw, "DEAD TOPIC\tREASON\tCOUNT")
		for _, d := range st.DeadByReason {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", d.Topic, d.Reason, d.Count)
		}
		_ = tw.Flush()
	}
	if len(st.Holds) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(tw, "HELD KEY\tROUTE\tDEAD LETTER\tHELD FOR\tBEHIND")
		for _, h := range st.Holds {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\n", h.Key, showRoute(h.Route), h.ID, st.Now.Sub(h.Since).Round(time.Second), h.Behind)
		}
		_ = tw.Flush()
		var keys int64
		for _, h := range st.Held {
			keys += h.Keys
		}
		if keys > int64(len(st.Holds)) {
			fmt.Fprintf(out, "(%d held keys in all; the oldest shown)\n", keys)
		}
		fmt.Fprintln(out, "(dlq replay --id N sends the dead letter, then the messages behind it; dlq purge --id N drops it and lets them go)")
	}
	if len(st.FanOut) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(tw, "FAN-OUT ROUTE\tPENDING\tRETRYING\tOLDEST\tDEAD")
		for _, r := range st.FanOut {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\n", r.Route, r.Pending, r.Retrying, r.OldestAge.Round(time.Millisecond), r.DeadLetters)
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(out)
	if len(st.Relays) == 0 {
		// After a clean stop (a demo, a batch job) the lanes are all free
		// by design: no alarm, only what it means.
		fmt.Fprintln(out, "no relay running: messages wait until one starts")
		return
	}
	fmt.Fprintln(tw, "RELAY\tROUTE\tHOST\tPID\tVERSION\tLANES\tIN FLIGHT\tHEARTBEAT\tDESTINATION")
	for _, r := range st.Relays {
		beat := "never"
		if !r.HeartbeatAt.IsZero() {
			beat = st.Now.Sub(r.HeartbeatAt).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.Route, r.Hostname, r.PID, r.Version, r.Lanes, r.InFlight, beat, destination(st.Now, r.Delivery))
	}
	_ = tw.Flush()
	printOutages(out, st)
	printStrain(out, st)
	if len(st.Lanes) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(tw, "LANES OF ROUTE\tRELAYS\tWORKED\tUNWORKED\tMISSING ROWS")
		for _, l := range st.Lanes {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", showRoute(l.Route), l.Relays, l.Worked, l.Unworked, l.Missing)
		}
		_ = tw.Flush()
	}
	for _, m := range st.Mixed {
		fmt.Fprintf(out, "WARNING: route %s: its relays run %d different configurations and share its lanes "+
			"(relays started with --on-config-change allow during a rolling change do; otherwise stop the ones in the wrong configuration):\n",
			showRoute(m.Route), len(m.Configs))
		for _, c := range m.Configs {
			fmt.Fprintf(out, "  %s: %s\n", strings.Join(c.Relays, ", "), c.Config)
		}
	}
	fmt.Fprintf(out, "lanes held by no live relay: %d\n", st.FreeLanes)
	for _, l := range st.Lanes {
		if l.Relays > 0 && l.Unworked > 0 {
			// Relays of the route take free lanes and recreate missing rows
			// at their next heartbeat: this persisting is the problem.
			fmt.Fprintf(out, "WARNING: route %s: %d lanes worked by no live relay (%d lane rows missing); their messages wait. "+
				"Relays of the route take them at their next heartbeat; if they stay unworked, check the relays' logs.\n",
				showRoute(l.Route), l.Unworked, l.Missing)
		}
	}
}

// printOutages says, for each relay that finds its route's destination
// down (its outage breaker open), since when, after how many probes, and
// why.
func printOutages(out io.Writer, st operator.Status) {
	down := false
	for _, r := range st.Relays {
		if !r.Down() {
			continue
		}
		down = true
		fmt.Fprintf(out, "WARNING: route %s, relay %s: destination down since %s (%s ago, %d probes): %s\n",
			showRoute(r.Route), r.ID, r.DownSince.UTC().Format(time.RFC3339), max(st.Now.Sub(*r.DownSince), 0).Round(time.Second),
			r.DownProbes, oneLine(r.DownCause, 500))
	}
	if down {
		fmt.Fprintln(out, "(a route whose destination is down claims one message at a time, as a probe, until one gets through; its messages count no attempt meanwhile)")
	}
}

// destination is a relay's DESTINATION cell: delivering, or its state
// and for how long.
func destination(now time.Time, d operator.Delivery) string {
	since := d.Since()
	if since == nil {
		return operator.Delivering
	}
	what := map[string]string{operator.DestinationDown: "down", operator.RateLimited: "rate limited", operator.Degraded: "degraded"}[d.State]
	return what + " for " + max(now.Sub(*since), 0).Round(time.Second).String()
}

// printStrain says, for each relay whose route waits for a rate limit or
// sees messages fail (and whose destination is not down: printOutages
// said so), since when and why.
func printStrain(out io.Writer, st operator.Status) {
	for _, r := range st.Relays {
		if r.Down() || r.Since() == nil {
			continue
		}
		what := "rate limited"
		if r.State == operator.Degraded {
			what = "degraded (messages fail and count attempts)"
		}
		fmt.Fprintf(out, "NOTE: route %s, relay %s: %s since %s (%s ago): %s\n",
			showRoute(r.Route), r.ID, what, r.Since().UTC().Format(time.RFC3339), max(st.Now.Sub(*r.Since()), 0).Round(time.Second),
			oneLine(r.Cause(), 500))
	}
}

// printRetryErrors says why messages retry: the last error per topic and
// route, with the earliest and latest first failure of the messages that
// carry it.
func printRetryErrors(out io.Writer, st operator.Status) {
	if len(st.RetryErrors) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RETRYING TOPIC\tROUTE\tCOUNT\tFIRST SEEN\tLAST SEEN\tEXAMPLE MESSAGE ID\tLAST ERROR")
	sampled := false
	for _, e := range st.RetryErrors {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Topic, showRoute(e.Route), e.Count,
			ageSince(st.Now, e.FirstSeen), ageSince(st.Now, e.LastSeen), e.ExampleID, oneLine(e.Error, 120))
		sampled = sampled || e.Sampled
	}
	_ = tw.Flush()
	if sampled {
		fmt.Fprintf(out, "(counted over the %d failing messages due soonest per table: more are failing)\n", operator.RetryErrorScan)
	}
}

// ageSince is how long ago t was on the database's clock ("-" for the
// zero time).
func ageSince(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return max(now.Sub(t), 0).Round(time.Second).String() + " ago"
}

// showRoute quotes a route name ("" is the route of a relay without
// routes).
func showRoute(r string) string { return strconv.Quote(r) }

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// show writes v to out as indented JSON when asJSON, else as print
// renders it for a terminal.
func show[T any](out io.Writer, asJSON bool, v T, print func(io.Writer, T)) error {
	if asJSON {
		return writeJSON(out, v)
	}
	print(out, v)
	return nil
}

// selectionFlags are shared by dlq list, replay and purge.
type selectionFlags struct {
	ids        []string
	topic      string
	key        string
	reason     string
	route      string
	olderThan  time.Duration
	deadAfter  string
	deadBefore string
	all        bool
	// flags tells --route "" (the default route) from no --route.
	flags *pflag.FlagSet
}

func (s *selectionFlags) add(cmd *cobra.Command, withAll bool) {
	f := cmd.Flags()
	s.flags = f
	f.StringSliceVar(&s.ids, "id", nil, "dead letter id (repeat or comma-separate)")
	f.StringVar(&s.topic, "topic", "", "only dead letters of this topic")
	f.StringVar(&s.key, "key", "", "only dead letters of this message key")
	f.StringVar(&s.reason, "reason", "", "only dead letters of this reason: "+strings.Join(operator.Reasons(), " or "))
	f.StringVar(&s.deadAfter, "dead-after", "", "only dead letters that died at or after this RFC 3339 time")
	f.StringVar(&s.deadBefore, "dead-before", "", "only dead letters that died before this RFC 3339 time")
	f.StringVar(&s.route, "route", "", "only dead letters of this fan-out destination route (\"\" for the outbox's own, the default route)")
	f.DurationVar(&s.olderThan, "older-than", 0, "only dead letters that died longer ago than this, e.g. 720h")
	if withAll {
		f.BoolVar(&s.all, "all", false, "every dead letter (required when no other selector is given)")
	}
}

func (s *selectionFlags) selection() (operator.Selection, error) {
	sel := operator.Selection{Topic: s.topic, Key: s.key, Reason: s.reason, Route: s.route, All: s.all}
	sel.DefaultRoute = s.route == "" && s.flags != nil && s.flags.Changed("route")
	for _, t := range []struct {
		name, raw string
		to        *time.Time
	}{{"dead-after", s.deadAfter, &sel.DeadAfter}, {"dead-before", s.deadBefore, &sel.DeadBefore}} {
		if t.raw == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.raw)
		if err != nil {
			return sel, usagef("outbox: %s: want an RFC 3339 time such as 2026-11-01T00:00:00Z, got %q", t.name, t.raw)
		}
		*t.to = v
	}
	for _, raw := range s.ids {
		id, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err != nil || id <= 0 {
			return sel, usagef("outbox: id: %q is not a positive integer", raw)
		}
		sel.IDs = append(sel.IDs, id)
	}
	if s.olderThan < 0 {
		return sel, usagef("outbox: older-than: must not be negative")
	}
	sel.OlderThan = s.olderThan // measured on the database's clock
	if err := sel.Validate(); err != nil {
		return sel, &usageError{err}
	}
	return sel, nil
}

func newDLQ(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, replay and purge dead letters",
		Long: `Dead letters are messages that failed permanently or ran out of attempts.
They keep their full content, attempts and errors. Replay puts them back in
the outbox under their original message id; two operators replaying at once
never publish a message twice. A dead fan-out copy (its ROUTE column is set)
is replayed to that destination route only. A dead letter whose dedup key a
pending message holds is skipped and reported, not replayed twice (see
dlq replay --help).`,
	}
	cmd.AddCommand(newDLQList(g), newDLQShow(g), newDLQReplay(g), newDLQPurge(g))
	return cmd
}

func (g *globals) admin(cmd *cobra.Command) (*operator.Admin, func(), error) {
	pool, err := g.connect(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	a, err := operator.New(pool, g.schema)
	if err != nil {
		pool.Close()
		return nil, nil, &usageError{err}
	}
	return a, pool.Close, nil
}

func newDLQList(g *globals) *cobra.Command {
	var sel selectionFlags
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters (oldest first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := sel.selection()
			if err != nil {
				return err
			}
			if limit < 1 {
				return usagef("outbox: limit: must be at least 1")
			}
			s.Limit = limit
			a, done, err := g.admin(cmd)
			if err != nil {
				return err
			}
			defer done()
			dls, err := a.List(cmd.Context(), s)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, dls)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tMESSAGE ID\tTOPIC\tKEY\tROUTE\tATTEMPTS\tREASON\tDEAD AT\tHOLDS KEY\tLAST ERROR")
			for _, d := range dls {
				route := d.Route
				if route == "" {
					route = "-"
				}
				// A dead letter that holds its key (on-dead-letter hold):
				// how many messages of the key wait for it.
				holds := "-"
				if d.Holds {
					holds = fmt.Sprintf("yes, %d behind", d.Behind)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.MessageID, d.Topic, deref(d.Key), route, d.Attempts,
					d.Reason, d.DeadAt.Format(time.RFC3339), holds, oneLine(deref(d.LastError), 80))
			}
			return tw.Flush()
		},
	}
	sel.add(cmd, false)
	cmd.Flags().IntVar(&limit, "limit", 100, "most dead letters to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (payload base64)")
	return cliOnly(cmd)
}

func newDLQShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter in full, as JSON (one document per dead fan-out copy)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return usagef("outbox: id: %q is not an integer", args[0])
			}
			a, done, err := g.admin(cmd)
			if err != nil {
				return err
			}
			defer done()
			ds, err := a.Show(cmd.Context(), id)
			if err != nil {
				return err
			}
			type shown struct {
				operator.DeadLetter
				Payload         any    `json:"payload"`
				PayloadEncoding string `json:"payload_encoding"`
			}
			for _, d := range ds {
				s := shown{DeadLetter: d}
				if utf8.Valid(d.Payload) {
					s.Payload, s.PayloadEncoding = string(d.Payload), "text"
				} else {
					s.Payload, s.PayloadEncoding = base64.StdEncoding.EncodeToString(d.Payload), "base64"
				}
				if err := writeJSON(g.stdout, s); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// dlqChange builds dlq replay and dlq purge: both take a non-empty
// selection and --dry-run, and report what they did (or would do).
// selected reads a dead-letter selection from the flags (refusing an
// empty one) and opens the operator API for it.
func (g *globals) selected(cmd *cobra.Command, sel *selectionFlags) (operator.Selection, *operator.Admin, func(), error) {
	s, err := sel.selection()
	if err != nil {
		return s, nil, nil, err
	}
	if s.Empty() {
		return s, nil, nil, &usageError{operator.ErrEmptySelection}
	}
	a, done, err := g.admin(cmd)
	return s, a, done, err
}

func dlqChange(g *globals, use, short, example, verb, dryVerb string,
	do func(ctx context.Context, a *operator.Admin, s operator.Selection, dry bool) (int, string, error)) *cobra.Command {
	var sel selectionFlags
	var dry bool
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, a, done, err := g.selected(cmd, &sel)
			if err != nil {
				return err
			}
			defer done()
			n, detail, err := do(cmd.Context(), a, s, dry)
			if err != nil {
				return err
			}
			if dry {
				verb = dryVerb
			}
			fmt.Fprintf(g.stdout, "%s %d dead letters%s\n", verb, n, detail)
			return nil
		},
	}
	sel.add(cmd, true)
	cmd.Flags().BoolVar(&dry, "dry-run", false, "only show what would be done")
	return cliOnly(cmd)
}

func newDLQReplay(g *globals) *cobra.Command {
	var sel selectionFlags
	var dry, clearKeys, asJSON bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Put dead letters back in the outbox (same message id)",
		Long: `Puts the selected dead letters back in the outbox under their original id and
message id, with a fresh attempt count; a dead fan-out copy goes back to its
destination route only. Two operators replaying at once never publish a
message twice.

Dedup keys. A dead letter keeps its dedup key and gets it back on replay.
When a pending message holds that key (the application wrote the operation
again while the first one was dead), the dead letter is skipped, stays in
the table, and the report names the pending message: replaying both would
publish the same operation twice under two message ids, and consumers that
deduplicate by message id would act on both (for payments: twice). Decide
per dead letter: purge it when it is the same operation, replay it again
once the pending message is delivered, or replay it without its dedup key
(--clear-conflicting-dedup-keys) when it is a different one. Of several
selected dead letters sharing a dedup key, the oldest gets it. A conflict
never stops the other dead letters: they are replayed, and every selected
dead letter is reported as replayed, replayed without its dedup key, or
skipped with the reason. Skips do not change the exit status (0).`,
		Example: `  outbox-relay dlq replay --id 42
  outbox-relay dlq replay --topic orders --dry-run
  outbox-relay dlq replay --all
  outbox-relay dlq replay --id 42 --clear-conflicting-dedup-keys
  outbox-relay dlq replay --all --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, a, done, err := g.selected(cmd, &sel)
			if err != nil {
				return err
			}
			defer done()
			res, err := a.Replay(cmd.Context(), s, operator.ReplayOptions{DryRun: dry, ClearConflictingDedupKeys: clearKeys})
			if err != nil {
				return err
			}
			return show(g.stdout, asJSON, res, printReplay)
		},
	}
	sel.add(cmd, true)
	f := cmd.Flags()
	f.BoolVar(&dry, "dry-run", false, "only show what would be done")
	f.BoolVar(&clearKeys, "clear-conflicting-dedup-keys", false,
		"replay a dead letter whose dedup key a pending message holds without its dedup key, instead of skipping it")
	f.BoolVar(&asJSON, "json", false, "print the outcome of every selected dead letter as JSON")
	return cliOnly(cmd)
}

// printReplay reports a replay: the replayed ids, then one line per dead
// letter replayed without its dedup key or skipped, with the reason.
func printReplay(out io.Writer, res operator.ReplayResult) {
	verb, clearedVerb, skipVerb := "replayed", "replayed", "skipped"
	if res.DryRun {
		verb, clearedVerb, skipVerb = "would replay", "would replay", "would skip"
	}
	replayed := res.IDs(operator.Replayed)
	fmt.Fprintf(out, "%s %d dead letters%s\n", verb, len(replayed), idList(replayed))
	for _, o := range []struct {
		outcome operator.ReplayOutcome
		head    string
	}{
		{operator.ReplayedWithoutDedupKey, clearedVerb + " %d dead letters without their dedup key:\n"},
		{operator.ReplaySkipped, skipVerb + " %d dead letters (left in the table):\n"},
	} {
		n := res.Count(o.outcome)
		if n == 0 {
			continue
		}
		fmt.Fprintf(out, o.head, n)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tROUTE\tDEDUP KEY\tREASON")
		for _, d := range res.DeadLetters {
			if d.Outcome != o.outcome {
				continue
			}
			route := d.Route
			if route == "" {
				route = "-"
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", d.ID, route, oneLine(deref(d.DedupKey), 40), d.Reason)
		}
		_ = tw.Flush()
	}
	for _, d := range res.DeadLetters {
		if d.Outcome == operator.ReplaySkipped && (d.Cause == operator.CauseDedupKeyPending || d.Cause == operator.CauseDedupKeyInRun) {
			fmt.Fprintln(out, "(--clear-conflicting-dedup-keys replays those whose dedup key is held without it; see dlq replay --help)")
			break
		}
	}
}

func newDLQPurge(g *globals) *cobra.Command {
	return dlqChange(g, "purge", "Delete dead letters for good", `  outbox-relay dlq purge --older-than 720h`,
		"purged", "would purge",
		func(ctx context.Context, a *operator.Admin, s operator.Selection, dry bool) (int, string, error) {
			r, err := a.PurgeHolds(ctx, s, dry)
			if err != nil || r.ReleasedKeys == 0 {
				return int(r.Purged), "", err
			}
			// The keys they held go on with their next message.
			g.log.InfoContext(ctx, "dead letters purged; their keys are released", "purged", r.Purged, "released_keys", r.ReleasedKeys)
			return int(r.Purged), fmt.Sprintf("; %d held keys released", r.ReleasedKeys), nil
		})
}

func idList(ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(":")
	for i, id := range ids {
		if i == 20 {
			fmt.Fprintf(&b, " … (%d more)", len(ids)-20)
			break
		}
		fmt.Fprintf(&b, " %d", id)
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

func newReplay(g *globals) *cobra.Command {
	var from, to, topic, route string
	var newIDs, dry, isolated bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Publish archived messages again (needs run --archive)",
		Long: `Copies messages from the archive (kept when relays run with --archive) back
into the outbox, in their original order, so that consumers rebuilding their
state receive them again. Messages keep their message id unless --new-ids is
given. With --route, only the messages that route delivered are replayed, and
only to that route (the routes are read from the config file; when the relays
isolate their routes, give --isolate-routes as they have it, or let
OUTBOX_ISOLATE_ROUTES or the file's isolate-routes say it).`,
		Example: `  outbox-relay replay --from 2026-11-01T00:00:00Z --topic orders --dry-run
  outbox-relay replay --from 24h
  outbox-relay replay --from 24h --route crm --config relay.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel := operator.ArchiveSelection{Topic: topic, NewIDs: newIDs, Route: route}
			var err error
			if route != "" {
				if sel.ToRouteOnly, err = routeIsFed(g, route, isolated); err != nil {
					return err
				}
			}
			if sel.From, sel.FromAgo, err = parseWhen(from); err != nil || from == "" {
				return usagef("outbox: from: want an RFC 3339 time or a duration ago such as 24h, got %q", from)
			}
			if to != "" {
				if sel.To, sel.ToAgo, err = parseWhen(to); err != nil {
					return usagef("outbox: to: want an RFC 3339 time or a duration ago, got %q", to)
				}
			}
			a, done, err := g.admin(cmd)
			if err != nil {
				return err
			}
			defer done()
			n, err := a.ReplayArchive(cmd.Context(), sel, dry)
			if err != nil {
				return err
			}
			verb := "replayed"
			if dry {
				verb = "would replay"
			}
			fmt.Fprintf(g.stdout, "%s %d archived messages\n", verb, n)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "replay messages created at or after this time (RFC 3339, or a duration ago like 24h); required")
	f.StringVar(&to, "to", "", "and before this time")
	f.StringVar(&topic, "topic", "", "only this topic")
	f.StringVar(&route, "route", "", "only what this route of the config file delivered, to this route only")
	f.BoolVar(&newIDs, "new-ids", false, "give replayed messages fresh message ids")
	f.BoolVar(&dry, "dry-run", false, "only count")
	cliOnly(cmd)
	// Not command-line only: it is the relays' setting, read like run reads
	// it (flag, OUTBOX_ISOLATE_ROUTES, the file's isolate-routes).
	f.BoolVar(&isolated, "isolate-routes", false, "the relays isolate their routes (run --isolate-routes): with --route, replay into that route's copies")
	return cmd
}

// parseWhen accepts an RFC 3339 time or a duration before now (which the
// database's clock resolves).
func parseWhen(s string) (time.Time, time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Time{}, d, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, 0, err
}

// routeIsFed reports whether the config file's route name takes its
// messages from the fan-out router's copies: every route does when the
// relays isolate their routes (isolate-routes).
func routeIsFed(g *globals, name string, isolated bool) (bool, error) {
	specs, _, err := decodeRouteSpecs(g)
	if err != nil {
		return false, err
	}
	fed := fedRoutes(specs, isolated)
	for i, sp := range specs {
		if sp.Name == name {
			return fed[i], nil
		}
	}
	return false, usagef("outbox: route: no route %q in the config file's routes", name)
}
