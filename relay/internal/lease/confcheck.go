package lease

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// Relays that disagree on a route must not share its lanes unnoticed: a
// relay started with another sink beside the running ones would take its
// share of the lanes and deliver that share elsewhere. Each relay
// registers a fingerprint of its route's configuration (the relay makes
// it: Config.ConfigHash) with a summary for operators, and the leaser
// compares it with the live relays' of its route at every heartbeat.

// comparable reports whether h is a fingerprint this relay can compare
// its own (mine) with: one of a relay of a version that registers
// fingerprints the same way, which the part before the colon says.
func comparable(h, mine string) bool {
	v, _, ok := strings.Cut(h, ":")
	own, _, _ := strings.Cut(mine, ":")
	return ok && v == own
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

// judge sorts others, the route's live relays of another configuration
// than mine (a fingerprint), into a verdict.
func judge(others []store.OtherConfig, mine string) verdict {
	v := verdict{configs: 1}
	seen := map[string]bool{}
	for _, o := range others {
		if !comparable(o.Hash, mine) {
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
// because live relays run another configuration there. It wraps
// Config.ErrConflict.
func (l *Leaser) conflictError(blocking []store.OtherConfig) error {
	what := "this relay takes none of their lanes"
	if l.cfg.OnConfigChange == ConfigWait {
		what += " and waits until they are gone (the end of a rolling change)"
	}
	return fmt.Errorf("%w: route %q: live relays of the route run another configuration; %s. "+
		"This relay: %s. Running: %s. Stop them, give this relay their configuration, "+
		"or allow both to deliver during a rolling change (--allow-config-change; Config.OnConfigChange %q)",
		l.cfg.ErrConflict, l.cfg.Route, what, l.cfg.ConfigSummary, describeOthers(blocking), ConfigAllow.String())
}

// judgeOthers applies the relay's policy to the other configurations of
// its route seen at a heartbeat (or before it registers): it reports
// them to the hooks and the log, and returns an error (wrapping
// Config.ErrConflict) when the relay must take no lane.
func (l *Leaser) judgeOthers(others []store.OtherConfig) error {
	v := judge(others, l.cfg.ConfigHash)
	l.hooks.RouteConfigs(v.configs)
	l.routeConfigs.Store(int64(v.configs))
	now := time.Now()
	if v.unknown > 0 && now.Sub(l.unknownWarned) >= confWarnEvery {
		var unknown []store.OtherConfig
		for _, o := range others {
			if !comparable(o.Hash, l.cfg.ConfigHash) {
				unknown = append(unknown, o)
			}
		}
		l.log.Warn("live relays of the route registered no configuration this relay can compare (an older version): their routes are not known to agree",
			"this", l.cfg.ConfigSummary, "others", describeOthers(unknown))
		l.unknownWarned = now
	}
	if len(v.blocking) > 0 && l.cfg.OnConfigChange != ConfigAllow {
		err := l.conflictError(v.blocking)
		if now.Sub(l.conflictWarned) >= confWarnEvery {
			if l.cfg.OnConfigChange == ConfigWait {
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
		l.log.Info("no live relay of the route runs another configuration any more; taking a share of its lanes", "this", l.cfg.ConfigSummary)
		l.conflictWarned = time.Time{}
	}
	if v.configs > 1 && now.Sub(l.coexistWarned) >= confWarnEvery {
		var known []store.OtherConfig
		for _, o := range others {
			if comparable(o.Hash, l.cfg.ConfigHash) {
				known = append(known, o)
			}
		}
		l.log.Warn("relays of the route run different configurations and share its lanes (allowed for a rolling change)",
			"configurations", v.configs, "this", l.cfg.ConfigSummary, "others", describeOthers(known))
		l.coexistWarned = now
	}
	if v.configs == 1 {
		l.coexistWarned = time.Time{}
	}
	return nil
}
