// Package dbcred gives the command line's database password of each new
// connection (relay.PoolConfig.Password) from where credentials that
// rotate live: a file that a secret manager or an agent rewrites (File),
// the output of a command (Command), an AWS RDS or Aurora IAM
// authentication token (RDSIAM). Each is a Source, whose Password the
// pool calls before every connection it opens.
//
// A password is never logged, and never part of an error: errors name the
// option (database-password-file, database-password-command,
// database-iam-auth) and the file, the command's exit and its stderr,
// never what a file holds or what a command printed on stdout.
//
// The relay's own settings of the pool (session parameters, the pooler
// probe) live in relay.NewPool; the flags that choose a Source, in
// internal/app/cli.
package dbcred

import (
	"context"
	"time"
)

// Source gives passwords, each reused until its deadline. A password
// whose deadline has passed is fetched again by the first caller, while
// the others wait for it (a pool that opens 7 connections at once runs a
// command once, not 7 times). It is safe for concurrent use.
type Source struct {
	// fetch gets a new password at now (the Source's clock) and says
	// until when it may be reused (a time not after now: not at all).
	fetch func(ctx context.Context, now time.Time) (pw string, until time.Time, err error)
	now   func() time.Time // the clock of the deadlines; tests move it
	sem   chan struct{}    // one fetch at a time, and the cache it fills
	pw    string
	until time.Time
}

func newSource(fetch func(ctx context.Context, now time.Time) (string, time.Time, error)) *Source {
	return &Source{fetch: fetch, now: time.Now, sem: make(chan struct{}, 1)}
}

// Password returns the password for a connection about to be opened: the
// last one fetched while its deadline has not passed, else a new one.
// An error is not kept: the next call fetches again.
func (s *Source) Password(ctx context.Context) (string, error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-s.sem }()
	now := s.now()
	if s.pw != "" && now.Before(s.until) {
		return s.pw, nil
	}
	pw, until, err := s.fetch(ctx, now)
	if err != nil {
		s.pw = ""
		return "", err
	}
	s.pw, s.until = pw, until
	return pw, nil
}
