package pgtest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/testproc"
)

// TestServer runs a throwaway server through what the fault tests do to
// it: committed rows survive a restart and a crash (SIGKILL of every
// process), the server refuses connections while stopped, and nothing of
// it is left once its test has ended.
func TestServer(t *testing.T) {
	t.Parallel()
	var dir string
	t.Run("lifecycle", func(t *testing.T) {
		s := Server(t)
		dir = s.proc.Dir
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pool, schema := s.Schema(t)
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "messages"}.Sanitize()).Scan(&n))
		_, err := pool.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
		require.NoError(t, err)
		startTime := func() (ts time.Time) {
			t.Helper()
			c, err := pgx.Connect(ctx, s.URL())
			require.NoError(t, err)
			defer c.Close(ctx)
			require.NoError(t, c.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&ts))
			return ts
		}
		first := startTime()

		require.NoError(t, s.Restart(ctx))
		afterRestart := startTime()
		require.True(t, afterRestart.After(first), "restart: start time %s, before %s", afterRestart, first)

		require.NoError(t, s.Stop(ctx))
		_, err = pgx.Connect(ctx, s.URL())
		require.Error(t, err, "connected to a stopped server")
		require.NoError(t, s.Start(ctx))

		require.NoError(t, s.Kill())
		require.Empty(t, s.proc.Processes(), "processes left after Kill")
		require.NoError(t, s.Start(ctx))
		require.True(t, startTime().After(afterRestart))
		c, err := pgx.Connect(ctx, s.URL())
		require.NoError(t, err)
		defer c.Close(ctx)
		require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n))
		require.Equal(t, 1, n, "a committed row was lost in the crash")
	})
	if dir == "" {
		return // the server did not start: nothing to check
	}
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "server directory %s left behind: %v", dir, err)
	require.Empty(t, testproc.ProcessesIn(dir), "server processes left behind")
}

// TestStart runs a throwaway server the way a program that is not a test
// does (the benchmark's live rows on a logical cluster): the extra
// configuration lines take effect, and Close leaves nothing behind.
func TestStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, "wal_level = logical")
	if errors.Is(err, ErrUnavailable) {
		Unavailable(t, "%v", err)
	}
	require.NoError(t, err)
	dir := s.proc.Dir
	closed := false
	defer func() {
		if !closed {
			_ = s.Close()
		}
	}()
	c, err := pgx.Connect(ctx, s.URL())
	require.NoError(t, err)
	var level string
	require.NoError(t, c.QueryRow(ctx, "SHOW wal_level").Scan(&level))
	require.NoError(t, c.Close(ctx))
	require.Equal(t, "logical", level)

	closed = true
	require.NoError(t, s.Close())
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "server directory %s left behind: %v", dir, err)
	require.Empty(t, testproc.ProcessesIn(dir), "server processes left behind")
}

// TestServerPasswordAuth: with Options.PasswordAuth, a role other than
// postgres connects over TCP with its password only (a wrong one and none
// are refused, SQLSTATE 28P01), replication connections too, while
// postgres stays trusted, so that the instance's URL, Pool and Schema
// work unchanged.
func TestServerPasswordAuth(t *testing.T) {
	t.Parallel()
	s := ServerWith(t, Options{PasswordAuth: true, Conf: []string{"wal_level = logical"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, _ := s.Schema(t) // postgres, trusted
	_, err := pool.Exec(ctx, "CREATE ROLE pw_role LOGIN REPLICATION PASSWORD 'right-one'")
	require.NoError(t, err)
	as := func(password string, params ...string) error {
		cfg, err := pgconn.ParseConfig(s.URL())
		require.NoError(t, err)
		cfg.User, cfg.Password = "pw_role", password
		for i := 0; i+1 < len(params); i += 2 {
			cfg.RuntimeParams[params[i]] = params[i+1]
		}
		c, err := pgconn.ConnectConfig(ctx, cfg)
		if err == nil {
			require.NoError(t, c.Close(ctx))
		}
		return err
	}
	refused := func(err error, what string) {
		t.Helper()
		var pe *pgconn.PgError
		require.True(t, errors.As(err, &pe), "%s: must be refused, got %v", what, err)
		require.Equal(t, "28P01", pe.Code, "%s: %s", what, pe.Message)
	}
	require.NoError(t, as("right-one"))
	refused(as("wrong"), "a wrong password")
	refused(as(""), "no password")
	require.NoError(t, as("right-one", "replication", "database"), "a replication connection with the password")
	refused(as("wrong", "replication", "database"), "a replication connection with a wrong password")
}
