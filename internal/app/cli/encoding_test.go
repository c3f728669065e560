package cli_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// Issue 35, finding 9: in a SQL_ASCII database the claim's LIKE and the
// relay's topic matcher disagree ('?' is a byte in one, a character in the
// other), so a topic went to the wrong route, and text that is not UTF-8
// reached the sinks altered. migrate and run refuse such a database with
// exit 2, naming server_encoding and how to fix it.
func TestRefusesDatabaseNotUTF8(t *testing.T) {
	srv := pgtest.Server(t) // a database of its own encoding: not on the shared server
	ctx := context.Background()
	_, err := srv.Pool(t).Exec(ctx, `CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
	require.NoError(t, err)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	u.Path = "/ascii"
	t.Setenv("DATABASE_URL", u.String())
	t.Setenv("OUTBOX_SCHEMA", "outbox")

	for _, args := range [][]string{
		{"migrate"},
		{"run", "--sink", "stdout", "--connect-timeout", "5s"},
		{"run", "--sink", "stdout", "--connect-timeout", "5s", "--migrate"},
	} {
		code, _, stderr := run(t, args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, `database "ascii" has server_encoding SQL_ASCII`, args)
		require.Contains(t, stderr, "ENCODING 'UTF8'", args)
	}
	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var migrated bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('outbox.messages') IS NOT NULL").Scan(&migrated))
	require.False(t, migrated, "migrate created nothing")
}
