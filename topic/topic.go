// Package topic is the one topic-pattern language of outbox-relay: the
// patterns of relay routes (relay.Route, relay.Config.Topics, the CLI's
// routes table) and of webhook routes (httpsink.Route) are read by Match
// here, and nowhere else.
//
// The language:
//
//   - '*' matches any run of characters, including none, '.' and '/'
//     ("orders.*" matches "orders.placed" and "orders.eu.placed").
//   - '?' matches exactly one character (one Unicode code point).
//   - Every other character matches itself: there are no character
//     classes and no escapes ('[', '\', '%' and '_' are plain characters).
//   - A pattern matches the whole topic, not a prefix of it.
//
// The relay also runs these patterns in SQL (as LIKE patterns); that
// translation lives with the relay's queries, not here. This package
// needs the standard library only, so that sinks can use it.
package topic

import "unicode/utf8"

// Match reports whether topic matches pattern.
func Match(pattern, topic string) bool {
	// Iterative with one backtrack point: the last '*' seen. A later
	// mismatch retries that star one character longer, which is enough
	// because a star can absorb anything an earlier star could.
	p, t := 0, 0
	star, starT := -1, 0
	for t < len(topic) {
		if p < len(pattern) {
			switch pr, pn := utf8.DecodeRuneInString(pattern[p:]); {
			case pr == '*':
				star, starT = p, t
				p++
				continue
			case pr == '?':
				_, tn := utf8.DecodeRuneInString(topic[t:])
				p, t = p+pn, t+tn
				continue
			default:
				if tr, tn := utf8.DecodeRuneInString(topic[t:]); tr == pr {
					p, t = p+pn, t+tn
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		_, tn := utf8.DecodeRuneInString(topic[starT:])
		starT += tn
		p, t = star+1, starT
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// MatchAny reports whether topic matches one of patterns.
func MatchAny(patterns []string, topic string) bool {
	for _, p := range patterns {
		if Match(p, topic) {
			return true
		}
	}
	return false
}

// Overlap reports whether some topic matches both patterns: whether two
// routes can ever take the same message. It is exact, decided on the
// patterns alone.
func Overlap(a, b string) bool {
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
