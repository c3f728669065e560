package relay_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/relay"
)

// PoolConfig.Password gives the password of every new connection, in
// place of the URL's: asked again for each one, so that a rotated
// password is used from the next connection on, while open ones keep
// theirs; its error fails the connection, wrapped, and so does an empty
// password. The server asks for the role's password (a throwaway one).
func TestPoolPasswordForEachConnection(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerWith(t, pgtest.Options{PasswordAuth: true})
	admin := srv.Pool(t)
	ctx := context.Background()
	_, err := admin.Exec(ctx, "CREATE ROLE pool_pw LOGIN PASSWORD 'first'")
	require.NoError(t, err)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("pool_pw", "not-this-one") // replaced by Password

	var mu sync.Mutex
	current, asked := "first", 0
	var fail error
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: u.String(), MaxConns: 4, Password: func(context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		asked++
		return current, fail
	}})
	require.NoError(t, err)
	defer pool.Close()
	user := func() (name string, err error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return "", err
		}
		defer c.Release()
		err = c.QueryRow(ctx, "SELECT current_user").Scan(&name)
		return name, err
	}
	name, err := user()
	require.NoError(t, err)
	require.Equal(t, "pool_pw", name)
	require.Equal(t, 1, asked, "asked once for one connection (the pooler probe included)")

	// The rotation: the server and the source change; the open connection
	// keeps working, and a new one logs in with the new password.
	_, err = admin.Exec(ctx, "ALTER ROLE pool_pw PASSWORD 'second'")
	require.NoError(t, err)
	mu.Lock()
	current = "second"
	mu.Unlock()
	held, err := pool.Acquire(ctx)
	require.NoError(t, err, "the open connection")
	name, err = user() // the held one is busy: a new connection
	require.NoError(t, err)
	require.Equal(t, "pool_pw", name)
	require.Equal(t, 2, asked)
	held.Release()

	// A failing source fails the new connection, saying where it failed.
	pool.Reset() // closes the idle connections: the next Acquire opens one
	boom := errors.New("vault: permission denied")
	mu.Lock()
	fail = boom
	mu.Unlock()
	_, err = user()
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "outbox: database password: vault: permission denied")
	mu.Lock()
	current, fail = "", nil
	mu.Unlock()
	_, err = user()
	require.ErrorContains(t, err, "outbox: database password: the password source gave an empty password")
	var pe *pgconn.PgError
	require.False(t, errors.As(err, &pe), "no login was tried without a password: %v", err)
}
