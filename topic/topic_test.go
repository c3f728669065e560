package topic_test

import (
	"path"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/topic"
)

// The language as relay routes and webhook routes both read it. Rows
// marked "path.Match differs" are where webhook routes matched otherwise
// before they shared this language.
var matchCases = []struct {
	pattern, topic string
	want           bool
}{
	{"orders.*", "orders.placed", true},
	{"orders.*", "orders", false},
	{"orders.*", "orders.", true},
	{"orders.*", "orders.a.b", true},
	{"orders.*", "xorders.placed", false},
	{"*.created", "users.created", true},
	{"*.created", "users.created.v2", false},
	{"*", "", true},
	{"*", "anything at all", true},
	{"", "", true},
	{"", "x", false},
	{"**", "ab", true},
	{"a*b*c", "abbbc", true},
	{"a*b*c", "acb", false},
	{"a?c", "abc", true},
	{"a?c", "ac", false},
	{"a?c", "abbc", false},
	{"?", "é", true},      // one character, not one byte
	{"??", "é", false},    // ...
	{"a_c", "abc", false}, // SQL LIKE's wildcards are plain characters
	{"100%", "100%", true},
	{"100%", "1000", false},
	{"orders/*", "orders/eu/placed", true}, // path.Match differs: '*' stopped at '/'
	{"a?c", "a/c", true},                   // path.Match differs: '?' did not match '/'
	{"[ab]", "a", false},                   // path.Match differs: no character classes
	{"[ab]", "[ab]", true},                 // ...'[' is a plain character
	{`a\*`, `a\x`, true},                   // path.Match differs: no escapes
	{`a\*`, "a*", false},                   // ...
}

func TestMatch(t *testing.T) {
	t.Parallel()
	for _, c := range matchCases {
		require.Equal(t, c.want, topic.Match(c.pattern, c.topic), "%q %q", c.pattern, c.topic)
		require.Equal(t, c.want, reference(c.pattern, c.topic), "reference: %q %q", c.pattern, c.topic)
	}
	require.True(t, topic.MatchAny([]string{"a", "b.*"}, "b.c"))
	require.False(t, topic.MatchAny(nil, "b.c"))
}

// A pattern with many stars against a long topic that misses at the end:
// a backtracking matcher takes exponential time here.
func TestMatchManyStars(t *testing.T) {
	t.Parallel()
	long := make([]byte, 10000)
	for i := range long {
		long[i] = 'a'
	}
	require.False(t, topic.Match("*a*a*a*a*a*a*a*a*a*a*b", string(long)))
}

func TestOverlap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"orders.*", "orders.created", true},
		{"orders.*", "*.created", true},
		{"orders.*", "users.*", false},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"*", "", true},
		{"", "", true},
		{"x", "", false},
		{"a*b", "*c", false},
		{"a*b*", "*c*", true},
		{"?", "**", true},
		{"ab", "a", false},
		{"é*", "?x", true},
	} {
		require.Equal(t, c.want, topic.Overlap(c.a, c.b), "%q vs %q", c.a, c.b)
		require.Equal(t, c.want, topic.Overlap(c.b, c.a), "%q vs %q", c.b, c.a)
	}
	// Against brute force over a small alphabet.
	pats := words([]string{"a", "b", "?", "*"}, 3)
	topics := words([]string{"a", "b"}, 6)
	for _, a := range pats {
		for _, b := range pats {
			brute := false
			for _, tp := range topics {
				if topic.Match(a, tp) && topic.Match(b, tp) {
					brute = true
					break
				}
			}
			require.Equal(t, brute, topic.Overlap(a, b), "%q vs %q", a, b)
		}
	}
}

// Match against the plain recursive definition, over every short pattern
// and topic of a small alphabet.
func TestMatchAgainstReference(t *testing.T) {
	t.Parallel()
	for _, p := range words([]string{"a", "b", "?", "*"}, 4) {
		for _, tp := range words([]string{"a", "b"}, 5) {
			require.Equal(t, reference(p, tp), topic.Match(p, tp), "%q %q", p, tp)
		}
	}
}

func FuzzMatch(f *testing.F) {
	for _, c := range matchCases {
		f.Add(c.pattern, c.topic)
	}
	f.Fuzz(func(t *testing.T, pattern, tp string) {
		if len(pattern) > 10 || len(tp) > 20 {
			return // the reference backtracks exponentially
		}
		if got, want := topic.Match(pattern, tp), reference(pattern, tp); got != want {
			t.Fatalf("Match(%q, %q) = %v, reference says %v", pattern, tp, got, want)
		}
	})
}

// reference is the language's definition, written as directly as
// possible (and exponential in the worst case).
func reference(pattern, tp string) bool {
	if pattern == "" {
		return tp == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; ; {
			if reference(pattern[1:], tp[i:]) {
				return true
			}
			if i == len(tp) {
				return false
			}
			_, n := utf8.DecodeRuneInString(tp[i:])
			i += n
		}
	case '?':
		if tp == "" {
			return false
		}
		_, n := utf8.DecodeRuneInString(tp)
		return reference(pattern[1:], tp[n:])
	}
	if tp == "" {
		return false
	}
	pr, pn := utf8.DecodeRuneInString(pattern)
	tr, tn := utf8.DecodeRuneInString(tp)
	return pr == tr && reference(pattern[pn:], tp[tn:])
}

// words returns every string of at most n letters of alphabet.
func words(alphabet []string, n int) []string {
	out := []string{""}
	last := []string{""}
	for ; n > 0; n-- {
		var next []string
		for _, w := range last {
			for _, c := range alphabet {
				next = append(next, w+c)
			}
		}
		out = append(out, next...)
		last = next
	}
	return out
}

// Match against path.Match (what webhook routes used) and the recursive
// definition (what relay routes used), on a router's typical patterns.
func BenchmarkMatch(b *testing.B) {
	cases := []struct{ pattern, topic string }{
		{"orders.*", "orders.placed"},
		{"*.created", "customers.eu.created"},
		{"billing.invoice.*", "orders.placed"},
	}
	for _, impl := range []struct {
		name  string
		match func(p, t string) bool
	}{
		{"topic.Match", topic.Match},
		{"path.Match", func(p, t string) bool { ok, _ := path.Match(p, t); return ok }},
		{"recursive", reference},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for b.Loop() {
				for _, c := range cases {
					impl.match(c.pattern, c.topic)
				}
			}
		})
	}
}
