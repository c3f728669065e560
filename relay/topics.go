package relay

import (
	"strings"

	"github.com/outbox-relay/outbox-relay/topic"
)

// likePatterns turns topic patterns (package topic: '*' any run, '?' one
// character, nothing else special) into LIKE patterns with '\' as the
// escape character, so that the claim filters in SQL as topic.Match does
// in Go. nil stays nil (no filter).
func likePatterns(globs []string) []string {
	if len(globs) == 0 {
		return nil
	}
	out := make([]string, len(globs))
	for i, g := range globs {
		var b strings.Builder
		for _, c := range g {
			switch c {
			case '\\', '%', '_':
				b.WriteByte('\\')
				b.WriteRune(c)
			case '*':
				b.WriteByte('%')
			case '?':
				b.WriteByte('_')
			default:
				b.WriteRune(c)
			}
		}
		out[i] = b.String()
	}
	return out
}

// MatchTopic reports whether topic matches the pattern the way a route's
// Topics do.
//
// Deprecated: use topic.Match, the one pattern language of relay and
// webhook routes.
func MatchTopic(pattern, t string) bool { return topic.Match(pattern, t) }

// PatternsOverlap reports whether some topic matches both patterns.
//
// Deprecated: use topic.Overlap.
func PatternsOverlap(a, b string) bool { return topic.Overlap(a, b) }
