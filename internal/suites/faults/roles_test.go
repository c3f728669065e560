package faults

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	ops "github.com/outbox-relay/outbox-relay/relay/operator" // "operator" is the role here
)

// applyRoleFile renders migrations/roles/<name>.sql for schema and role the
// way the file's header tells operators to, and runs it as the schema
// owner.
func applyRoleFile(t testing.TB, pool *pgxpool.Pool, name, schema, role string) {
	t.Helper()
	root, err := relaybin.ModuleRoot()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "migrations", "roles", name+".sql"))
	require.NoError(t, err)
	tmpl, err := template.New(name).Option("missingkey=error").Parse(string(raw))
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, tmpl.Execute(&b, struct{ Schema, Role string }{migrations.Ident(schema), migrations.Ident(role)}))
	_, err = pool.Exec(context.Background(), b.String())
	require.NoError(t, err, "applying %s.sql", name)
}

// rolePool connects as role.
func rolePool(t testing.TB, role string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dbURL(t, role))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// denied asserts that err is Postgres' insufficient_privilege.
func denied(t testing.TB, err error, what string) {
	t.Helper()
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "%s: must be refused, got %v", what, err)
	require.Equal(t, "42501", pe.Code, "%s: %s", what, pe.Message)
}

// TestLeastPrivilegeRoles applies migrations/roles/{writer,relay,operator}.sql
// to fresh roles on a fresh schema, then runs an application as the writer
// (allowed: every way of writing; refused: reading, changing or deleting
// rows), the relay binary as the relay role end to end (deliveries, a
// retry, a dead letter) and the operator commands as the operator role.
func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	writer, relayRole, operator := testRole(t, pool, "faults_writer"), testRole(t, pool, "faults_relay"), testRole(t, pool, "faults_operator")
	applyRoleFile(t, pool, "writer", schema, writer)
	applyRoleFile(t, pool, "relay", schema, relayRole)
	applyRoleFile(t, pool, "operator", schema, operator)
	s := migrations.Ident(schema)

	// The writer.
	wp := rolePool(t, writer)
	var want []string
	want = append(want, commit(t, wp, schema, messages("orders", keyNames("k", 5), 0, 50, map[string]string{"type": "OrderPlaced"}))...)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	tx, err := wp.Begin(ctx)
	require.NoError(t, err)
	dedup := outbox.Message{Topic: "orders", Key: "d", Payload: []byte(payloadOf("orders", "d", 0)), DedupKey: "order-42", DeliverAfter: time.Millisecond}
	first, err := w.Insert(ctx, tx, dedup)
	require.NoError(t, err)
	again, err := w.Insert(ctx, tx, dedup)
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[0].MessageID, again[0].MessageID, "the writer finds the pending message of a dedup key")
	require.NoError(t, tx.Commit(ctx))
	want = append(want, string(dedup.Payload))
	for i, q := range []string{
		`SELECT ` + s + `.enqueue('orders', 'e', $1::text)`,
		`SELECT ` + s + `.enqueue('orders', 'e', $1::text, '{"a":"b"}', now(), 'dk-1')`,
		`SELECT ` + s + `.enqueue('orders', 'e', $1::text, '{"a":"b"}', now(), 'dk-1')`, // duplicate: same id
		`INSERT INTO ` + s + `.messages (topic, key, payload) VALUES ('orders', 'e', convert_to($1::text, 'UTF8'))`,
	} {
		p := payloadOf("orders", "e", i)
		_, err := wp.Exec(ctx, q, p)
		require.NoError(t, err, q)
		if i != 2 {
			want = append(want, p)
		}
	}
	db, err := sql.Open("pgx", dbURL(t, writer))
	require.NoError(t, err)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteSQL(ctx, stx, outbox.Message{Topic: "orders", Key: "sql", Payload: []byte(payloadOf("orders", "sql", 0))}))
	require.NoError(t, stx.Commit())
	want = append(want, payloadOf("orders", "sql", 0))
	// A message the receiver rejects (dead letter) and one it fails once
	// (retry): the relay role needs both paths.
	commit(t, wp, schema, []outbox.Message{{Topic: "orders", Key: "poison", Payload: []byte("reject-me")}})
	want = append(want, commit(t, wp, schema, []outbox.Message{{Topic: "orders", Key: "flaky", Payload: []byte(payloadOf("orders", "flaky", 0))}})...)

	for _, q := range []string{
		`SELECT payload FROM ` + s + `.messages`,
		`SELECT * FROM ` + s + `.messages`,
		`SELECT topic, key FROM ` + s + `.messages WHERE dedup_key IS NULL`,
		`UPDATE ` + s + `.messages SET topic = 'x'`,
		`DELETE FROM ` + s + `.messages`,
		`TRUNCATE ` + s + `.messages`,
		`INSERT INTO ` + s + `.messages (topic, payload, attempts) VALUES ('t', '\x00', 99)`,
		`SELECT * FROM ` + s + `.dead_letters`,
		`DELETE FROM ` + s + `.dead_letters`,
		`UPDATE ` + s + `.lanes SET owner = 'me'`,
		`DELETE FROM ` + s + `.relays`,
		`CREATE TABLE ` + s + `.mine (x int)`,
	} {
		_, err := wp.Exec(ctx, q)
		denied(t, err, "writer: "+q)
	}

	// The relay binary as the relay role, end to end.
	var flaky atomic.Int32
	rc := newReceiver(t, func(r *http.Request, body []byte) (int, string) {
		switch {
		case string(body) == "reject-me":
			return http.StatusBadRequest, "rejected"
		case strings.Contains(string(body), "|flaky|") && flaky.Add(1) == 1:
			return http.StatusServiceUnavailable, "try again"
		}
		return http.StatusNoContent, ""
	})
	// With the hold policy: the relay role parks the dead letter (an
	// UPDATE of its row), the operator role replays it in place.
	p := startRelay(t, dbURL(t, relayRole), schema, "--sink", rc.url(), "--retry-initial", "100ms", "--exit-when-empty", "--on-dead-letter", "hold")
	require.Equal(t, 0, p.wait(60*time.Second), p.logs.tail(20))
	checkAllDelivered(t, want, rc.deliveries())
	require.GreaterOrEqual(t, flaky.Load(), int32(2), "the flaky message was retried")
	require.Zero(t, p.logs.Count("permission denied"), p.logs.tail(10))
	rp := rolePool(t, relayRole)
	for _, q := range []string{
		`INSERT INTO ` + s + `.messages (topic, payload) VALUES ('t', '\x00')`,
		`DELETE FROM ` + s + `.dead_letters`,
		`SELECT * FROM ` + s + `.archive`,
		`DROP TABLE ` + s + `.lanes`,
	} {
		_, err := rp.Exec(ctx, q)
		if err != nil && strings.Contains(err.Error(), "must be owner") {
			continue // DROP: also refused, with another code
		}
		denied(t, err, "relay: "+q)
	}

	// Fan-out as the relay role: the router copies, both routes deliver.
	fan := commit(t, wp, schema, messages("fan.out", keyNames("f", 3), 0, 20, nil))
	cfgFile := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("routes:\n"+
		"  - name: main\n    topics: [\"fan.*\"]\n    sink: "+rc.url()+"\n"+
		"  - name: copy\n    topics: [\"fan.*\"]\n    fanout: true\n    sink: "+rc.url()+"-copy\n"), 0o600))
	before := len(rc.deliveries())
	p = startRelay(t, dbURL(t, relayRole), schema, "--config", cfgFile, "--exit-when-empty")
	require.Equal(t, 0, p.wait(60*time.Second), p.logs.tail(20))
	require.Zero(t, p.logs.Count("permission denied"), p.logs.tail(10))
	fanned := rc.deliveries()[before:]
	require.Equal(t, 2*len(fan), distinctCopies(fanned), "each fan-out message reached both routes")

	// The operator's commands.
	op := []string{"--database-url", dbURL(t, operator), "--schema", schema}
	code, out, stderr := cli(t, append([]string{"status", "--json"}, op...)...)
	require.Equal(t, 0, code, stderr)
	var st ops.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 1, st.DeadLetters)
	code, out, stderr = cli(t, append([]string{"dlq", "replay", "--all"}, op...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 1")
	require.Equal(t, 1, count(t, pool, schema, "messages"))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason)
SELECT id + 1000, message_id, topic, key, payload, headers, created_at, 1, 'permanent' FROM `+s+`.messages`)
	require.NoError(t, err)
	code, out, stderr = cli(t, append([]string{"dlq", "purge", "--all"}, op...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "purged 1")
	// A purge of a dead letter that holds its key: the operator role
	// cannot delete messages, the trigger releasing the key can.
	_, err = pool.Exec(ctx, `WITH p AS (UPDATE `+s+`.messages SET available_at = 'infinity', held_since = now(), held_route = '' RETURNING *)
INSERT INTO `+s+`.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason)
SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent' FROM p`)
	require.NoError(t, err)
	code, out, stderr = cli(t, append([]string{"dlq", "purge", "--all"}, op...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "purged 1 dead letters; 1 held keys released")
	require.Equal(t, 0, count(t, pool, schema, "messages"), "the parked row went with its dead letter")
	t.Logf("writer: %d messages written 6 ways (pgx, dedup, enqueue x3, INSERT, database/sql), 12 reads/changes refused; "+
		"relay role: %d delivered, 1 retried, 1 dead-lettered, 4 statements refused; operator: status, dlq replay, dlq purge",
		len(want), distinct(rc.deliveries()))
}

// TestRelaysUnderDifferentRoles runs two relays on one schema, one as the
// least-privilege relay role and one as the (superuser) test user. A
// non-superuser sees other roles' sessions in pg_stat_activity without
// their backend_start, which fast failover compares with the one each
// relay registered: the relay role's relay takes the other relay for dead
// at every heartbeat, deletes its registration and keeps every lane, so
// the second relay never gets a share of the work. Messages are still
// delivered, in order. Fixed: the reap treats a hidden backend_start as
// alive; this test keeps it fixed.
func TestRelaysUnderDifferentRoles(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	role := testRole(t, pool, "faults_relay")
	applyRoleFile(t, pool, "relay", schema, role)
	rc := newReceiver(t, nil)
	args := []string{"--sink", rc.url(), "--heartbeat", "200ms", "--lease-ttl", "2s"}
	a := startRelay(t, dbURL(t, role), schema, args...)
	b := startRelay(t, pgtest.URL(), schema, args...)
	want := commit(t, pool, schema, messages("orders", keyNames("k", 50), 0, 2000, nil))

	// Sample the registrations and lane shares over 15 heartbeats of a,
	// the relay that would reap b (3s at 200ms), after 5 to settle.
	ctx := context.Background()
	s := migrations.Ident(schema)
	samples, bMissing := 0, 0
	var lanesA, lanesB int
	sample := func() {
		var regs int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*),
    (SELECT count(*) FROM `+s+`.lanes l JOIN `+s+`.relays r ON r.id = l.owner WHERE r.pid = $1),
    (SELECT count(*) FROM `+s+`.lanes l JOIN `+s+`.relays r ON r.id = l.owner WHERE r.pid = $2)
FROM `+s+`.relays WHERE pid = $2`, a.pid(), b.pid()).Scan(&regs, &lanesA, &lanesB))
		samples++
		if regs == 0 {
			bMissing++
		}
	}
	heartbeats := func(n int, each func()) {
		t.Helper()
		beat := func() (at time.Time) {
			_ = pool.QueryRow(ctx, `SELECT coalesce(max(heartbeat_at), 'epoch') FROM `+s+`.relays WHERE pid = $1`, a.pid()).Scan(&at)
			return at
		}
		last, beats := beat(), 0
		eventually(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
			if each != nil {
				each()
			}
			if at := beat(); at.After(last) {
				last, beats = at, beats+1
			}
			return beats >= n, fmt.Sprintf("%d of %d heartbeats of relay a seen", beats, n)
		})
	}
	heartbeats(5, nil)
	heartbeats(15, sample)
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return count(t, pool, schema, "messages") == 0, "pending"
	})
	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	t.Logf("relay as %s owns %d lanes, relay as superuser %d; the superuser relay's registration was missing in %d of %d samples (reaped as dead)",
		role, lanesA, lanesB, bMissing, samples)
	require.Positive(t, lanesB, "the second relay never gets a share of the lanes")
	require.Zero(t, bMissing, "a live relay was reaped as dead")
}

// distinctCopies counts distinct (payload, path) pairs: the same message
// delivered to two routes (two webhook paths) counts twice.
func distinctCopies(ds []delivery) int {
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.Payload+"|"+d.Path] = true
	}
	return len(seen)
}
