package store

import (
	"context"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// stmt is a statement of the relay's hot path, rendered once: written and
// reviewed with named arguments (@name), run in the positional form pgx
// would produce from them. pgx.NamedArgs rewrites the text at every call
// (a lexer pass: tens of µs for the claim, see BenchmarkClaimRewrite, a
// few percent of a claim's round trip); doing it once keeps the names
// for the reader and the golden files at no cost per batch.
type stmt struct {
	// named is the statement as written, with @name arguments.
	named string
	// sql is named with the arguments replaced by $1..$n, and names the
	// argument of each, in order.
	sql   string
	names []string
}

// candidate finds what may be an argument's name. pgx's lexer decides
// which are (not those in quoted text or comments).
var candidate = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// newStmt renders named once.
func newStmt(named string) stmt {
	probe := pgx.NamedArgs{}
	for _, m := range candidate.FindAllStringSubmatch(named, -1) {
		probe[m[1]] = m[1]
	}
	sql, order, err := probe.RewriteQuery(context.Background(), nil, named, nil)
	if err != nil {
		panic("store: cannot render statement: " + err.Error())
	}
	s := stmt{named: named, sql: sql, names: make([]string, len(order))}
	for i, n := range order {
		s.names[i] = n.(string)
	}
	return s
}

// args orders a's values as the statement's positional arguments. A name
// the statement uses and a lacks is a bug in this package (the tests run
// every statement): it panics rather than send NULL in its place.
func (s stmt) args(a pgx.NamedArgs) []any {
	out := make([]any, len(s.names))
	for i, n := range s.names {
		v, ok := a[n]
		if !ok {
			panic("store: statement needs argument @" + n)
		}
		out[i] = v
	}
	return out
}
