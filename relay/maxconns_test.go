package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// roleURL returns u logged in as role.
func roleURL(u, role string) string {
	return strings.Replace(u, "postgres://postgres@", "postgres://"+role+"@", 1)
}

// smallServer is a throwaway server (pgtest.Server, never the shared one)
// with max_connections=20 (17 for roles that are not superusers), a
// migrated schema, and roles for relays (migrations/roles/relay.sql) and
// for the application (migrations/roles/writer.sql).
type smallServer struct {
	url    string
	admin  *pgxpool.Pool // superuser, 2 connections
	schema string
}

func newSmallServer(t *testing.T, relayRoles ...string) *smallServer {
	t.Helper()
	srv := pgtest.Server(t)
	u := srv.URL()
	ctx := context.Background()
	func() {
		conn, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		defer conn.Close(ctx)
		for _, set := range []string{"max_connections = 20", "superuser_reserved_connections = 3"} {
			_, err := conn.Exec(ctx, "ALTER SYSTEM SET "+set)
			require.NoError(t, err)
		}
	}()
	require.NoError(t, srv.Restart(ctx))
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	cfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	var maxConns string
	require.NoError(t, admin.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns))
	require.Equal(t, "20", maxConns)
	s := &smallServer{url: u, admin: admin, schema: "outbox"}
	_, err = migrations.Apply(ctx, admin, s.schema)
	require.NoError(t, err)
	grant := func(file, role string) {
		b, err := os.ReadFile(filepath.Join("..", "migrations", "roles", file))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		require.NoError(t, err)
		sql := strings.NewReplacer("{{.Schema}}", migrations.Ident(s.schema), "{{.Role}}", role).Replace(string(b))
		_, err = admin.Exec(ctx, sql)
		require.NoError(t, err)
	}
	grant("writer.sql", "app")
	for _, r := range relayRoles {
		grant("relay.sql", r)
	}
	return s
}

func (s *smallServer) relayConfig(t *testing.T) relay.Config {
	return relay.Config{
		Schema:       s.schema,
		Workers:      2,
		BatchSize:    20,
		PollInterval: 50 * time.Millisecond,
		LeaseTTL:     3 * time.Second,
		Heartbeat:    200 * time.Millisecond,
		Logger:       testLogger(t),
	}
}

// startRelay runs a relay as role with a pool of the least connections
// its configuration needs, until the test ends.
func (s *smallServer) startRelay(t *testing.T, role string, cfg relay.Config, sink sinks.Sink) *relay.Relay {
	t.Helper()
	pool, err := relay.NewPool(context.Background(), relay.PoolConfig{
		URL: roleURL(s.url, role), Workers: cfg.Workers, MaxConns: relay.Conns(cfg)})
	require.NoError(t, err)
	r, err := relay.New(pool, sink, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop within 30s")
		}
		pool.Close()
	})
	return r
}

// TestRelaysLeaveConnectionsForTheApplication: on a server with 17
// connections for ordinary roles, three relays capped at the least their
// configuration needs (2 workers, lane lease, LISTEN: 4 each) while health
// checks press on their pools, and an application committing one message
// per transaction through 2 connections. The application must never be
// refused a connection, and the relays deliver what it commits. Without a
// cap that counts the lease and LISTEN connections, each relay took 6
// sessions for a pool of 4 and the application was refused (53300).
func TestRelaysLeaveConnectionsForTheApplication(t *testing.T) {
	t.Parallel()
	s := newSmallServer(t, "relay")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sink := memory.New()
	sink.SetDelay(5 * time.Millisecond)
	var relays []*relay.Relay
	for i := 0; i < 3; i++ {
		relays = append(relays, s.startRelay(t, "relay", s.relayConfig(t), sink))
	}
	var probes sync.WaitGroup
	for _, r := range relays {
		for i := 0; i < 3; i++ {
			probes.Add(1)
			go func() {
				defer probes.Done()
				for ctx.Err() == nil {
					rctx, rcancel := context.WithTimeout(ctx, time.Second)
					_ = r.Ready(rctx)
					rcancel()
				}
			}()
		}
	}
	defer probes.Wait()
	defer cancel()
	eventually(t, 20*time.Second, func() bool {
		n := 0
		for _, r := range relays {
			n += r.OwnedLanes()
		}
		return n == 256
	}, "relays did not take the lanes")

	// The application: a fresh connection per transaction, as short-lived
	// processes, or a pool that grows under load, open them.
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	require.NoError(t, err)
	// Two writers: a closed connection's backend may outlive its close
	// for a moment on a loaded machine, so each writer can hold two slots
	// (12 + 2 × 2 = 16 of 17). Uncapped relays take 18 on their own.
	const writers, each = 2, 60
	var committed atomic.Int64
	var mu sync.Mutex
	failures := map[string]int{}
	var app sync.WaitGroup
	for i := 0; i < writers; i++ {
		app.Add(1)
		go func() {
			defer app.Done()
			for n := 0; n < each; n++ {
				err := func() error {
					tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					pc, err := pgx.Connect(tctx, roleURL(s.url, "app"))
					if err != nil {
						return err
					}
					defer pc.Close(context.Background())
					tx, err := pc.Begin(tctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(context.Background())
					if err := w.Write(tctx, tx, msg("t", fmt.Sprintf("k%d", n%50), "x")); err != nil {
						return err
					}
					return tx.Commit(tctx)
				}()
				if err != nil {
					var pe *pgconn.PgError
					key := err.Error()
					if errors.As(err, &pe) {
						key = pe.Code + " " + pe.Message
					}
					mu.Lock()
					failures[key]++
					mu.Unlock()
					continue
				}
				committed.Add(1)
			}
		}()
	}
	app.Wait()
	t.Logf("application: %d of %d transactions committed; failures: %v", committed.Load(), writers*each, failures)
	require.Empty(t, failures, "the application was refused connections")
	require.NoError(t, sink.WaitFor(waitCtx(t, 30*time.Second), int(committed.Load())), "the relays deliver what the application committed")
}

// TestStarvedRelayHandsItsLanesBack: two relays share the lanes; then one
// of them loses its worker connections and cannot open new ones (its role
// is at its connection limit, 53300, as on a full server), while its lane
// lease connection lives on. Before the fix it kept renewing
// its 128 lanes and their messages waited for as long as the starvation
// lasted. Now it hands them back after LeaseTTL, the other relay delivers
// them, and it takes its share again once it can connect.
func TestStarvedRelayHandsItsLanesBack(t *testing.T) {
	t.Parallel()
	s := newSmallServer(t, "relay_ok", "relay_starved")
	ctx := context.Background()
	sink := memory.New()
	healthy := s.startRelay(t, "relay_ok", s.relayConfig(t), sink)
	starved := s.startRelay(t, "relay_starved", s.relayConfig(t), sink)
	eventually(t, 20*time.Second, func() bool {
		return healthy.OwnedLanes() == 128 && starved.OwnedLanes() == 128
	}, "lanes not split: %d and %d", healthy.OwnedLanes(), starved.OwnedLanes())

	// Cut the starved relay's workers off: no new connections for its
	// role beyond the lane lease's session, which lives on, and every
	// other session terminated (its LISTEN too: telling that one apart
	// by its last query was a race, as the listener also runs the
	// watcher's lock attempts; the relay polls without it).
	_, err := s.admin.Exec(ctx, `ALTER ROLE relay_starved CONNECTION LIMIT 1`)
	require.NoError(t, err)
	var cut int
	require.NoError(t, s.admin.QueryRow(ctx, `
SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
WHERE a.usename = 'relay_starved'
  AND a.pid NOT IN (SELECT backend_pid FROM `+migrations.Ident(s.schema)+`.relays WHERE id = $1)`, starved.ID()).Scan(&cut))
	t.Logf("terminated %d worker sessions of the starved relay", cut)
	cutAt := time.Now()

	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := 0; i < 600; i++ {
		msgs = append(msgs, msg("t", fmt.Sprintf("k%d", i%300), fmt.Sprint(i))) // keys over every lane
	}
	tx, err := s.admin.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, sink.WaitFor(waitCtx(t, 30*time.Second), len(msgs)), "messages in the starved relay's lanes are delivered")
	t.Logf("all %d delivered %s after the cut", len(msgs), time.Since(cutAt).Round(100*time.Millisecond))
	require.Equal(t, 256, healthy.OwnedLanes())
	require.Equal(t, 0, starved.OwnedLanes())
	require.ErrorContains(t, starved.Ready(ctx), "no connection", "a starved relay is not ready")
	checkOrder(t, sink.Delivered())

	// Connections come back: the relay takes its share again.
	_, err = s.admin.Exec(ctx, `ALTER ROLE relay_starved CONNECTION LIMIT -1`)
	require.NoError(t, err)
	eventually(t, 30*time.Second, func() bool {
		return healthy.OwnedLanes() == 128 && starved.OwnedLanes() == 128
	}, "lanes not split again: %d and %d", healthy.OwnedLanes(), starved.OwnedLanes())
}
