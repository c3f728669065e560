package faults

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestPasswordRotation rotates the relay's database password under it,
// as a secret manager does: the role's password changes, the relay's
// password file (--database-password-file) is rewritten, and every
// session of the role is ended. The relay, the binary with --wakeup wal,
// must open its new sessions (workers, lane lease, LISTEN, the WAL's
// replication connection) with the new password, and deliver every
// message written before, during and after, none lost. A second rotation
// rewrites the file only after the sessions were ended (a secret
// manager's file lags behind the database): the relay's logins are
// refused until then, and it resumes by itself. The server is a
// throwaway one that asks the relay's role for its password
// (pgtest.Options.PasswordAuth).
func TestPasswordRotation(t *testing.T) {
	t.Parallel()
	srv := pgtest.ServerWith(t, pgtest.Options{PasswordAuth: true,
		Conf: []string{"wal_level = logical", "max_wal_senders = 4", "max_replication_slots = 4"}})
	pool, schema := srv.Schema(t) // postgres: trusted, not the relay's role
	const oldPW, newPW, newerPW = "old-Pw-7f3a9c", "new-Pw-2b81d4", "newer-Pw-95ce07"
	role := testRole(t, pool, "faults_rot")
	_, err := pool.Exec(context.Background(), "ALTER ROLE "+migrations.Ident(role)+" REPLICATION PASSWORD '"+oldPW+"'")
	require.NoError(t, err)
	applyRoleFile(t, pool, "relay", schema, role)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	u.User = url.User(role) // no password in the URL: the file gives it
	r := &rotation{t: t, pool: pool, schema: schema, role: role, url: u.String(), file: filepath.Join(t.TempDir(), "db-password")}
	r.write(oldPW)

	r.rc = newReceiver(t, nil)
	writer := startSteadyWriter(t, pool, schema, nil)
	r.p = startRelay(t, r.url, schema, "--sink", r.rc.url(), "--wakeup", "wal", "--database-password-file", r.file)
	// Caught up: the sessions are ended between batches, mostly, rather
	// than in the settle of the backlog's first big ones (which would
	// only mean redeliveries).
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, wal := r.fresh(nil)
		left := count(t, pool, schema, "messages")
		return wal && distinct(r.rc.deliveries()) >= 200 && left < 100, fmt.Sprintf("the relay follows the WAL and keeps up (%d delivered, %d pending, sessions %v):\n%s",
			distinct(r.rc.deliveries()), left, r.sessions(), r.p.logs.tail(5))
	})

	first := r.rotate(oldPW, newPW, false)
	late := r.rotate(newPW, newerPW, true)

	want := writer.stop()
	eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0 && distinct(r.rc.deliveries()) >= len(want), fmt.Sprintf("%d pending, %d of %d delivered", left, distinct(r.rc.deliveries()), len(want))
	})
	got := r.rc.deliveries()
	dups := checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema), "a rotation must not cost a message its attempts")
	logs := r.p.logs.String()
	for _, pw := range []string{oldPW, newPW, newerPW} {
		require.NotContains(t, logs, pw, "the relay logged a password")
	}
	t.Logf("%d messages written, all delivered (%d redelivered); rotation with the file rewritten first: %d sessions ended, "+
		"%d opened with the new password, the WAL sender back %s after, %d log lines of a refused login; "+
		"with the file rewritten after: %d ended, %d opened, the WAL sender back %s after, %d log lines of a refused login",
		len(want), dups, first.ended, first.opened, first.walBack.Round(time.Millisecond), first.refused,
		late.ended, late.opened, late.walBack.Round(time.Millisecond), late.refused)
	require.Zero(t, first.refused, "the relay tried the old password although the file had the new one")
	require.True(t, strings.Contains(logs, `"password_from":"database-password-file"`), "the relay says where its password comes from")
}

// rotation is TestPasswordRotation's database role, the relay that logs
// in as it and the relay's password file.
type rotation struct {
	t      *testing.T
	pool   *pgxpool.Pool // postgres
	schema string
	role   string
	url    string // the role's, without a password
	file   string // the relay's --database-password-file
	rc     *receiver
	p      *relayProc
}

// rotated is what one rotation saw: sessions of the role ended and opened
// again by the relay, how long after the end its WAL sender was back
// (seen within 20 ms), and how many log lines of refused logins it
// caused.
type rotated struct {
	ended, opened, refused int
	walBack                time.Duration
}

// write replaces the password file as a secret manager does: a new file
// renamed over the old one.
func (r *rotation) write(pw string) {
	require.NoError(r.t, os.WriteFile(r.file+".new", []byte(pw+"\n"), 0o600))
	require.NoError(r.t, os.Rename(r.file+".new", r.file))
}

// sessions lists the role's backends: pid, and whether it is the WAL
// sender.
func (r *rotation) sessions() map[int]bool {
	rows, err := r.pool.Query(context.Background(), `SELECT pid, backend_type = 'walsender' FROM pg_stat_activity WHERE usename = $1`, r.role)
	require.NoError(r.t, err)
	out := map[int]bool{}
	for rows.Next() {
		var pid int
		var wal bool
		require.NoError(r.t, rows.Scan(&pid, &wal))
		out[pid] = wal
	}
	require.NoError(r.t, rows.Err())
	return out
}

// fresh counts the sessions of the role that are not in before, and says
// whether one of them is the WAL sender.
func (r *rotation) fresh(before map[int]bool) (n int, wal bool) {
	for pid, w := range r.sessions() {
		if _, old := before[pid]; !old {
			n++
			wal = wal || w
		}
	}
	return n, wal
}

// login opens (and closes) a session of the role with pw.
func (r *rotation) login(pw string) error {
	cc, err := pgconn.ParseConfig(r.url)
	require.NoError(r.t, err)
	cc.Password = pw
	ctx := context.Background()
	c, err := pgconn.ConnectConfig(ctx, cc)
	if err == nil {
		_ = c.Close(ctx)
	}
	return err
}

// rotate sets the role's password to pw, writes it to the password file
// before or (fileLate) after it ends every session of the role, the WAL
// sender's too, and waits for the relay to have opened sessions again,
// the WAL sender among them, and delivered 400 more messages. oldPW no
// longer opens a session (checked): the relay's new sessions logged in
// with pw. With fileLate, the file is written once the relay has logged a
// refused login.
func (r *rotation) rotate(oldPW, pw string, fileLate bool) (got rotated) {
	t := r.t
	t.Helper()
	const refusedLine = "password authentication failed"
	_, err := r.pool.Exec(context.Background(), "ALTER ROLE "+migrations.Ident(r.role)+" PASSWORD '"+pw+"'")
	require.NoError(t, err)
	refusedBefore := r.p.logs.Count(refusedLine)
	if !fileLate {
		r.write(pw)
	}
	before := r.sessions()
	got.ended = terminateRole(t, r.pool, r.role)
	require.Positive(t, got.ended)
	endedAt := time.Now()
	delivered := distinct(r.rc.deliveries())
	var pe *pgconn.PgError
	require.True(t, errors.As(r.login(oldPW), &pe) && pe.Code == "28P01", "the old password still logs in")
	require.NoError(t, r.login(pw))
	if fileLate {
		eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
			return r.p.logs.Count(refusedLine) > refusedBefore, "the relay logged no refused login with the old password:\n" + r.p.logs.tail(5)
		})
		r.write(pw)
	}
	eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		n, wal := r.fresh(before)
		if wal && got.walBack == 0 {
			got.walBack = time.Since(endedAt)
		}
		return wal && n >= 3 && distinct(r.rc.deliveries()) >= delivered+400, fmt.Sprintf(
			"after the rotation: %d new sessions of the relay's role (WAL sender among them: %t), %d delivered since:\n%s",
			n, wal, distinct(r.rc.deliveries())-delivered, r.p.logs.tail(8))
	})
	got.opened, _ = r.fresh(before)
	got.refused = r.p.logs.Count(refusedLine) - refusedBefore
	return got
}
