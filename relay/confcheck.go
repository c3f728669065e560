package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Relays that disagree on a route must not share its lanes unnoticed: a
// relay started with another sink beside the running ones would take its
// share of the lanes and deliver that share elsewhere. Each relay
// registers a fingerprint of its route's configuration (what decides
// where and how the route's messages go) with a summary for operators,
// and its leaser compares it with the live relays' of its route at every
// heartbeat (see package lease, which is given the hash and the summary
// made here).

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
