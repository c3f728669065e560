package relay

import (
	"strings"
	"unicode/utf8"
)

// likePatterns turns glob patterns ('*' any run, '?' one character) into
// LIKE patterns with '\' as the escape character. nil stays nil (no
// filter).
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

// MatchTopic reports whether topic matches the glob pattern the way a
// route's Topics do.
func MatchTopic(pattern, topic string) bool {
	if pattern == "" {
		return topic == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(topic); i++ {
			if MatchTopic(pattern[1:], topic[i:]) {
				return true
			}
		}
		return false
	case '?':
		if topic == "" {
			return false
		}
		_, n := utf8.DecodeRuneInString(topic)
		return MatchTopic(pattern[1:], topic[n:])
	}
	if topic == "" {
		return false
	}
	pr, pn := utf8.DecodeRuneInString(pattern)
	tr, tn := utf8.DecodeRuneInString(topic)
	return pr == tr && MatchTopic(pattern[pn:], topic[tn:])
}

// PatternsOverlap reports whether some topic matches both glob patterns
// (as MatchTopic reads them): whether two routes can ever take the same
// message.
func PatternsOverlap(a, b string) bool {
	x, y := []rune(a), []rune(b)
	// seen[i][j]: the suffixes x[i:], y[j:] were already explored.
	seen := make([][]bool, len(x)+1)
	for i := range seen {
		seen[i] = make([]bool, len(y)+1)
	}
	var walk func(i, j int) bool
	walk = func(i, j int) bool {
		if seen[i][j] {
			return false
		}
		seen[i][j] = true
		switch {
		case i == len(x) && j == len(y):
			return true
		case i < len(x) && x[i] == '*':
			// The star matches nothing more, or swallows y's next character
			// (or y's star: both stars then still match anything).
			return walk(i+1, j) || (j < len(y) && walk(i, j+1))
		case j < len(y) && y[j] == '*':
			return walk(i, j+1) || (i < len(x) && walk(i+1, j))
		case i == len(x) || j == len(y):
			return false
		case x[i] == '?' || y[j] == '?' || x[i] == y[j]:
			return walk(i+1, j+1)
		}
		return false
	}
	return walk(0, 0)
}
