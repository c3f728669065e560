package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Relays that disagree on a route must not share its lanes unnoticed: a
// relay started with another sink beside the running ones would take its
// share of the lanes and deliver that share elsewhere. Each relay
// registers a fingerprint of its route's configuration (what decides
// where and how the route's messages go) with a summary for operators,
// and compares it with the live relays' of its route at every heartbeat.

// Configuration-change policies (Config.OnConfigChange): what a relay does
// while live relays of its route, registered before it, run another
// configuration.
const (
	// ConfigChangeWait: it takes no lane (it does not even register),
	// Ready reports why, and it logs a warning naming both
	// configurations each minute; it joins once they are gone (the end
	// of a rolling deploy).
	ConfigChangeWait = "wait"
	// ConfigChangeFail: Run stops and returns an error wrapping ErrConfig
	// that names both configurations.
	ConfigChangeFail = "fail"
	// ConfigChangeAllow: it takes its share of the lanes beside them (a
	// rolling change of a route's configuration that the operator
	// chose), logs a warning, and reports the coexistence to
	// Hooks.RouteConfigs.
	ConfigChangeAllow = "allow"
)

// fingerprintVersion prefixes every hash: the encoding below may change
// between releases, and a relay then reads another release's fingerprint
// as unknown (a warning) rather than as a different configuration (a
// refusal), so that upgrading the binary alone never stops a route.
// Version 2: the sink's target (sinks.Targeter) in place of its
// description, so that tuning no longer counts and webhook paths do.
const fingerprintVersion = "2"

// routeConfig is what the fingerprint covers: what decides where the
// route's messages go and the form in which they arrive. Tuning (workers,
// batch sizes, retries, timeouts, and the sink's own: concurrency, rates,
// reconnects) is left out, and so are credentials: relays may differ in
// them and still deliver every message the same way.
type routeConfig struct {
	Route         string       `json:"route"`
	Topics        []string     `json:"topics"`
	ExcludeTopics []string     `json:"exclude_topics"`
	Deliveries    bool         `json:"deliveries"`
	FanOut        []fanOutDest `json:"fan_out"`
	Sink          string       `json:"sink"`
	// Target is the sink's (see sinks.Targeter), else the redacted
	// Config.Destination.
	Target       string `json:"target"`
	Format       string `json:"format"`
	OnDeadLetter string `json:"on_dead_letter"`

	// destination is what the summary shows of the sink (the redacted
	// Config.Destination); the fingerprint leaves it out, since the CLI's
	// holds the sink's tuning. targetDigest stands, in the summary, for a
	// target the destination does not show whole.
	destination, targetDigest string
}

// formatted is implemented by a sink that encodes messages in a payload
// format (package sinks/format).
type formatted interface{ FormatName() string }

// fingerprint returns the hash and the summary of the route's
// configuration of a relay of cfg on sink.
func fingerprint(cfg Config, sink sinks.Sink) (hash, summary string) {
	rc := routeConfig{
		Route: cfg.Route, Topics: cfg.Topics, ExcludeTopics: cfg.ExcludeTopics, Deliveries: cfg.deliveries,
		// Redacted again, should an embedder pass a secret.
		FanOut: cfg.fanOut, destination: redact.URL(cfg.Destination), OnDeadLetter: cfg.OnDeadLetter, Format: "raw", Sink: "none",
	}
	rc.Target = rc.destination
	if t, ok := sinks.As[sinks.Targeter](sink); ok {
		rc.Target = t.Target()
		if rc.Target != rc.destination {
			// Two targets may read alike in their redacted description
			// (webhook paths are hidden): the digest tells them apart.
			d := sha256.Sum256([]byte(rc.Target))
			rc.targetDigest = hex.EncodeToString(d[:4])
		}
	}
	if f, ok := sinks.As[formatted](sink); ok {
		rc.Format = f.FormatName()
	}
	if sink != nil {
		inner := sink
		for {
			w, ok := inner.(sinks.Wrapper)
			if !ok {
				break
			}
			inner = w.Unwrap()
		}
		rc.Sink = fmt.Sprintf("%T", inner)
	}
	b, _ := json.Marshal(rc) // plain strings and slices: it cannot fail
	sum := sha256.Sum256(b)
	return fingerprintVersion + ":" + hex.EncodeToString(sum[:8]), rc.summary()
}

// maxSummary bounds a summary (a routes table's unrouted route excludes
// every route's patterns).
const maxSummary = 400

// summary says rc in a line: the destination (the embedder's redacted
// description, else the sink's type) and its target's digest, the topics,
// the format and the dead-letter policy.
func (rc routeConfig) summary() string {
	var b strings.Builder
	sink := rc.destination
	if sink == "" {
		sink = rc.Sink
	}
	fmt.Fprintf(&b, "sink %s", sink)
	if rc.targetDigest != "" {
		fmt.Fprintf(&b, " (target %s)", rc.targetDigest)
	}
	if rc.Format != "raw" {
		fmt.Fprintf(&b, " format %s", rc.Format)
	}
	topics := "*"
	if len(rc.Topics) > 0 {
		topics = strings.Join(rc.Topics, ",")
	}
	fmt.Fprintf(&b, ", topics %s", topics)
	if len(rc.ExcludeTopics) > 0 {
		fmt.Fprintf(&b, " except %s", strings.Join(rc.ExcludeTopics, ","))
	}
	if rc.Deliveries {
		b.WriteString(", fan-out copies")
	}
	for _, d := range rc.FanOut {
		fmt.Fprintf(&b, ", fans out to %s (%s)", d.Route, strings.Join(d.Topics, ","))
	}
	fmt.Fprintf(&b, ", on-dead-letter %s", rc.OnDeadLetter)
	s := b.String()
	if len(s) > maxSummary {
		s = s[:maxSummary-3] + "..."
	}
	return s
}

// ConfigSummary returns the summary of the route's configuration this
// relay registers (what status shows for it).
func (r *Relay) ConfigSummary() string { return r.lease.confSummary }

// comparable reports whether h is a fingerprint this relay can compare
// its own with: one of a relay of a version that registers fingerprints
// the same way.
func comparable(h string) bool {
	v, _, ok := strings.Cut(h, ":")
	return ok && v == fingerprintVersion
}

// verdict is what the other configurations of a route mean for a relay.
type verdict struct {
	// blocking: live relays registered earlier with another comparable
	// configuration; the relay takes none of their lanes unless allowed.
	blocking []store.OtherConfig
	// configs: how many comparable configurations the route's live relays
	// run, this relay's included; unknown: live relays that registered
	// none.
	configs, unknown int
}

func judge(others []store.OtherConfig) verdict {
	v := verdict{configs: 1}
	seen := map[string]bool{}
	for _, o := range others {
		if !comparable(o.Hash) {
			v.unknown++
			continue
		}
		if !seen[o.Hash] {
			seen[o.Hash] = true
			v.configs++
		}
		if o.Earlier {
			v.blocking = append(v.blocking, o)
		}
	}
	return v
}

// describeOthers names the configurations of others for a log line or an
// error: "relay-a (v1.2): sink …; relay-b …".
func describeOthers(others []store.OtherConfig) string {
	var parts []string
	for _, o := range others {
		s := o.Summary
		if s == "" {
			s = "configuration not registered"
		}
		parts = append(parts, fmt.Sprintf("relay %s (version %s): %s", o.ID, o.Version, s))
	}
	return strings.Join(parts, "; ")
}

// confWarnEvery is how often a relay repeats that it waits for relays of
// another configuration, or that configurations coexist.
const confWarnEvery = time.Minute

// conflictError is the error of a relay that takes no lane of its route
// because live relays run another configuration there.
func (l *leaser) conflictError(blocking []store.OtherConfig) error {
	what := "this relay takes none of their lanes"
	if l.onConfigChange == ConfigChangeWait {
		what += " and waits until they are gone (the end of a rolling change)"
	}
	return fmt.Errorf("%w: route %q: live relays of the route run another configuration; %s. "+
		"This relay: %s. Running: %s. Stop them, give this relay their configuration, "+
		"or allow both to deliver during a rolling change (--allow-config-change; Config.OnConfigChange %q)",
		ErrConfig, l.route, what, l.confSummary, describeOthers(blocking), ConfigChangeAllow)
}

// judgeOthers applies the relay's policy to the other configurations of
// its route seen at a heartbeat (or before it registers): it reports
// them to the hooks and the log, and returns an error (wrapping
// ErrConfig) when the relay must take no lane.
func (l *leaser) judgeOthers(others []store.OtherConfig) error {
	v := judge(others)
	l.hooks.RouteConfigs(v.configs)
	l.routeConfigs.Store(int64(v.configs))
	now := time.Now()
	if v.unknown > 0 && now.Sub(l.unknownWarned) >= confWarnEvery {
		var unknown []store.OtherConfig
		for _, o := range others {
			if !comparable(o.Hash) {
				unknown = append(unknown, o)
			}
		}
		l.log.Warn("live relays of the route registered no configuration this relay can compare (an older version): their routes are not known to agree",
			"this", l.confSummary, "others", describeOthers(unknown))
		l.unknownWarned = now
	}
	if len(v.blocking) > 0 && l.onConfigChange != ConfigChangeAllow {
		err := l.conflictError(v.blocking)
		if now.Sub(l.conflictWarned) >= confWarnEvery {
			if l.onConfigChange == ConfigChangeWait {
				// The usual course of a rolling change: a warning,
				// repeated each minute while it lasts.
				l.log.Warn("waiting for the route's relays of another configuration to leave", "error", err)
			} else {
				l.log.Error("refusing the route's lanes", "error", err)
			}
			l.conflictWarned = now
		}
		l.waitingConfig.Store(&err)
		return err
	}
	if l.waitingConfig.Swap(nil) != nil {
		l.log.Info("no live relay of the route runs another configuration any more; taking a share of its lanes", "this", l.confSummary)
		l.conflictWarned = time.Time{}
	}
	if v.configs > 1 && now.Sub(l.coexistWarned) >= confWarnEvery {
		var known []store.OtherConfig
		for _, o := range others {
			if comparable(o.Hash) {
				known = append(known, o)
			}
		}
		l.log.Warn("relays of the route run different configurations and share its lanes (allowed for a rolling change)",
			"configurations", v.configs, "this", l.confSummary, "others", describeOthers(known))
		l.coexistWarned = now
	}
	if v.configs == 1 {
		l.coexistWarned = time.Time{}
	}
	return nil
}

// RouteConfigs returns how many configurations the live relays of this
// relay's route ran at its last heartbeat (see Hooks.RouteConfigs); 0 before the
// first.
func (r *Relay) RouteConfigs() int { return int(r.lease.routeConfigs.Load()) }
