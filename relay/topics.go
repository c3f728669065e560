package relay

import (
	"strings"
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
