// Package pgtest gives tests an isolated, migrated outbox schema on the
// local Postgres server (TEST_DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/test), so tests that commit, LISTEN or
// use several connections can run in parallel; and, for tests that
// restart, stop, kill or reconfigure the server, a throwaway server of
// their own (Server). The shared server is only ever read and written.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// DefaultURL is used when TEST_DATABASE_URL is unset.
const DefaultURL = testkit.DefaultDatabaseURL

// URL returns the test database URL: testkit.DatabaseURL.
func URL() string { return testkit.DatabaseURL() }

// Unavailable fails the test under CI=true and skips it otherwise, saying
// why. Use it whenever a service the test needs cannot be reached.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testkit.Unavailable(t, "service", format, args...)
}

var (
	checkOnce sync.Once
	checkErr  error
)

// Pool connects to the test database, failing or skipping the test when it
// cannot be reached.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checkOnce.Do(func() {
		p, err := pgxpool.New(ctx, URL())
		if err == nil {
			err = p.Ping(ctx)
			p.Close()
		}
		checkErr = err
	})
	if checkErr != nil {
		Unavailable(t, "postgres at %s: %v", URL(), checkErr)
	}
	return connect(t, URL())
}

// connect opens a pool on url that is closed when the test ends.
func connect(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("database URL: %v", err)
	}
	cfg.MaxConns = 8
	// A test that forgets a transaction must not hold back vacuum (and
	// every benchmark) for the rest of the run.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "60000"
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// SchemaName returns a fresh schema name derived from the test's name.
func SchemaName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := strings.Trim(nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if len(base) > 36 {
		base = base[len(base)-36:]
	}
	return "t_" + base + "_" + hex.EncodeToString(b[:])
}

// Schema creates and migrates an isolated schema, dropped when the test
// ends. It returns a pool and the schema name.
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return SchemaNamed(t, SchemaName(t))
}

// SchemaNamed is Schema with a caller-chosen (possibly hostile) name.
func SchemaNamed(t testing.TB, schema string) (*pgxpool.Pool, string) {
	t.Helper()
	pool := Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatalf("migrate %q: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+migrations.Ident(schema)+" CASCADE"); err != nil {
			t.Logf("drop schema %q: %v", schema, err)
		}
	})
	return pool, schema
}
