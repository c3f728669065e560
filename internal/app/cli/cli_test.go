package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sinks/stdout"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrorsExit2AndNameTheField(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--sink", "nonsense://x"}, `sink: unsupported sink "nonsense://x"`},
		{[]string{"run", "--sink", "stdout://host"}, "stdout"},
		{[]string{"run", "--sink", "stdout"}, "database-url: required"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--workers", "0"}, "workers"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--heartbeat", "1m"}, "heartbeat"},
		{[]string{"run", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"run", "--batch-size", "many"}, "batch-size"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--batch-bytes", "0"}, "batch-bytes: must be positive"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--max-conns", "3"}, "max-conns: 3 is below the 4 connections"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--max-conns", "-1"}, "max-conns: must not be negative"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--wakeup", "push"}, "wakeup: must be one of auto, wal, poll, notify"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--watch-interval", "0s"}, "watch-interval: must be positive"},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--on-dead-letter", "park"}, `on-dead-letter: must be skip or hold, got "park"`},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--producer", " padded"}, `producer: " padded"`},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--on-config-change", "exit"}, `on-config-change: must be one of wait, fail, allow, got "exit"`},
		{[]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d", "--on-config-change", "fail", "--allow-config-change"},
			`allow-config-change: means --on-config-change allow, but --on-config-change is "fail"`},
		{[]string{"migrate", "--wakeup", "push", "--database-url", "postgres://x@127.0.0.1:1/d"}, "wakeup: must be one of"},
		{[]string{"status", "--log-level", "loud"}, "log-level"},
		{[]string{"migrate", "--print", "--schema", strings.Repeat("s", 60)}, "schema"},
		{[]string{"dlq", "replay", "--database-url", "postgres://x@127.0.0.1:1/d"}, "select dead letters"},
		{[]string{"dlq", "purge", "--id", "abc", "--database-url", "postgres://x@127.0.0.1:1/d"}, `id: "abc"`},
	}
	for _, tc := range cases {
		code, _, stderr := run(t, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

func TestPrecedenceFlagEnvFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "relay.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("schema: from_file\nbatch-size: 10\n"), 0o600))

	schemaOf := func(args ...string) string {
		code, out, stderr := run(t, append([]string{"migrate", "--print", "--config", cfg}, args...)...)
		require.Equal(t, 0, code, stderr)
		first := strings.SplitN(out, "\n", 2)[0]
		return first
	}
	require.Contains(t, schemaOf(), `"from_file"`)
	t.Setenv("OUTBOX_SCHEMA", "from_env")
	require.Contains(t, schemaOf(), `"from_env"`)
	require.Contains(t, schemaOf("--schema", "from_flag"), `"from_flag"`)

	// OUTBOX_CONFIG names the file when --config is absent.
	t.Setenv("OUTBOX_SCHEMA", "")
	os.Unsetenv("OUTBOX_SCHEMA")
	t.Setenv("OUTBOX_CONFIG", cfg)
	code, out, _ := run(t, "migrate", "--print")
	require.Equal(t, 0, code)
	require.Contains(t, strings.SplitN(out, "\n", 2)[0], `"from_file"`)
}

func TestConfigFileRejectsUnknownKeys(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "relay.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("schema: x\nbatch-sise: 10\n"), 0o600))
	code, _, stderr := run(t, "migrate", "--print", "--config", cfg)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown option "batch-sise" (did you mean "batch-size"?)`)
	require.Contains(t, stderr, "line 2")

	// Issue 34: a top-level typo gets a suggestion too.
	require.NoError(t, os.WriteFile(cfg, []byte("worker: 4\n"), 0o600))
	code, _, stderr = run(t, "migrate", "--print", "--config", cfg)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown option "worker" (did you mean "workers"?)`, stderr)

	require.NoError(t, os.WriteFile(cfg, []byte("- a\n- b\n"), 0o600))
	code, _, stderr = run(t, "migrate", "--print", "--config", cfg)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "mapping")
}

func TestPasswordNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "db-url")
	require.NoError(t, os.WriteFile(secretFile, []byte("postgres://app:s3cr3t-pw@127.0.0.1:1/test\n"), 0o600))
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_ADMIN_ADDR", "127.0.0.1:0")
	t.Setenv("OUTBOX_CONNECT_TIMEOUT", "300ms")
	t.Setenv("OUTBOX_DATABASE_URL_FILE", secretFile)
	code, out, stderr := run(t, "run", "--sink", "stdout")
	require.Equal(t, 1, code, stderr)
	require.NotContains(t, out+stderr, "s3cr3t-pw")
	require.Contains(t, stderr, "xxxxx", "the URL is shown redacted")

	code, out, stderr = run(t, "status", "--database-url", "postgres://app:s3cr3t-pw@127.0.0.1:1/test?sslmode=bogus")
	require.NotEqual(t, 0, code)
	require.NotContains(t, out+stderr, "s3cr3t-pw")
}

func TestHelpListsEnvAndDefaults(t *testing.T) {
	code, out, _ := run(t, "run", "--help")
	require.Equal(t, 0, code)
	for _, want := range []string{"OUTBOX_SINK", "OUTBOX_BATCH_SIZE", "DATABASE_URL", "(default 500)", "--exit-when-empty"} {
		require.Contains(t, out, want)
	}
	code, out, _ = run(t, "version")
	require.Equal(t, 0, code)
	require.Contains(t, out, "outbox-relay")
}

// TestRunEndToEnd drives the real commands: migrate, an application
// transaction (and a rolled-back one), run with the stdout sink, dlq.
func TestRunEndToEnd(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaName(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+migrations.Ident(schema)+" CASCADE")
	})
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	code, _, stderr := run(t, "migrate")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run(t, "migrate")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "up to date")

	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx,
		outbox.Message{Topic: "orders", Key: "o1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"type": "Placed"}},
		outbox.Message{Topic: "orders", Key: "o1", Payload: []byte{0xff, 0x00}},
	))
	require.NoError(t, tx.Commit(ctx))
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "o2", Payload: []byte(`{"rolled":"back"}`)}))
	require.NoError(t, tx.Rollback(ctx))

	code, out, stderr := run(t, "run", "--sink", "stdout", "--exit-when-empty", "--poll-interval", "20ms", "--admin-addr", "127.0.0.1:0")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	l0, _, err := stdout.ParseLine([]byte(lines[0]))
	require.NoError(t, err)
	require.Equal(t, "orders", l0.Topic)
	_, p1, err := stdout.ParseLine([]byte(lines[1]))
	require.NoError(t, err)
	require.Equal(t, []byte{0xff, 0x00}, p1)
	require.NotContains(t, out, "rolled")

	// A dead letter, inspected, replayed (dry run first) and purged.
	_, err = pool.Exec(ctx, `INSERT INTO `+migrations.Ident(schema)+`.dead_letters
		(id, message_id, topic, key, payload, headers, created_at, attempts, reason, last_error)
		VALUES (99, gen_random_uuid(), 'billing', 'b', 'x', '{}', now(), 3, 'max_attempts', 'HTTP 503')`)
	require.NoError(t, err)
	code, out, _ = run(t, "dlq", "list")
	require.Equal(t, 0, code)
	require.Contains(t, out, "HTTP 503")
	code, out, _ = run(t, "dlq", "show", "99")
	require.Equal(t, 0, code)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, "x", shown["payload"])
	code, out, _ = run(t, "dlq", "replay", "--topic", "billing", "--dry-run")
	require.Equal(t, 0, code)
	require.Contains(t, out, "would replay 1 dead letters: 99")
	code, out, _ = run(t, "dlq", "replay", "--id", "99")
	require.Equal(t, 0, code)
	require.Contains(t, out, "replayed 1")
	code, out, _ = run(t, "status", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"pending": 1`)
	code, out, _ = run(t, "dlq", "purge", "--all")
	require.Equal(t, 0, code)
	require.Contains(t, out, "purged 0")
	code, _, _ = run(t, "dlq", "show", "99")
	require.Equal(t, 1, code, "replayed dead letter is gone from the table")
}

func TestOperatorSelectorsIgnoreEnvironment(t *testing.T) {
	t.Setenv("OUTBOX_ALL", "true")
	t.Setenv("OUTBOX_PRINT", "true")
	code, _, stderr := run(t, "dlq", "purge", "--database-url", "postgres://x@127.0.0.1:1/d")
	require.Equal(t, 2, code, "OUTBOX_ALL must not select every dead letter")
	require.Contains(t, stderr, "select dead letters")
	code, out, _ := run(t, "dlq", "purge", "--help")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "OUTBOX_ALL")
}

// TestMalformedURLsNeverEchoThePassword gives the database and sink URLs
// with a password in userinfo or in a password-like parameter, in the
// malformed forms operators type by mistake (a missing colon or slash, no
// scheme, an invalid port or escape, a parameter in upper case) and in
// sink options and config sections that are parsed and echoed in errors.
// No output may contain the password.
func TestMalformedURLsNeverEchoThePassword(t *testing.T) {
	const pw = "S3cr3tPW"
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	databases := []string{
		"postgres//u:" + pw + "@h/db",
		"postgres:/u:" + pw + "@h/db",
		"postgres:u:" + pw + "@h/db",
		"u:" + pw + "@h/db",
		"postgres://u:" + pw + "@h:99999/db",
		"postgres://u:" + pw + "%zz@h/db",
		"postgres://u:" + pw + "@h/db#x",
		"postgres://u@127.0.0.1:1/db?PASSWORD=" + pw,
		"postgres://u@127.0.0.1:1/db?sslmode=bogus&Password=" + pw,
		"postgres://u@127.0.0.1:1/db?sslmode=bogus&password%3D" + pw,
		"host=127.0.0.1 port=1 PASSWORD=" + pw,
		"host=127.0.0.1 port=x password = '" + pw + " x'",
		"host=127.0.0.1 port=x u:" + pw + "@h",
	}
	for _, db := range databases {
		code, out, stderr := run(t, "status", "--database-url", db)
		require.NotEqual(t, 0, code, "%s: %s", db, stderr)
		require.NotContains(t, out+stderr, pw, "status --database-url %s", db)
	}
	sinkURLs := []string{
		"https//u:" + pw + "@h/x",
		"kafka//u:" + pw + "@h:1",
		"u:" + pw + "@h",
		"kafka://h:1/u:" + pw + "@x",
		"kafka://h:1?tls=password%3D" + pw,
		"kafka://u:" + pw + "@h:1?password=%" + pw[:2],
		"https://h.example.com/x?timeout=token=" + pw,
		"amqp://h/?exchange=x&heartbeat=password=" + pw,
	}
	for _, s := range sinkURLs {
		code, out, stderr := run(t, "run", "--database-url", "postgres://x@127.0.0.1:1/d", "--sink", s)
		require.Equal(t, 2, code, "%s: %s", s, stderr)
		require.NotContains(t, out+stderr, pw, "run --sink %s", s)
	}
	// A secret in the wrong place of a sink section: YAML's type errors
	// quote the value.
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("kafka:\n  sasl: "+pw+"\n"), 0o600))
	code, out, stderr := run(t, "run", "--config", cfg, "--database-url", "postgres://x@127.0.0.1:1/d", "--sink", "kafka://h:1")
	require.Equal(t, 2, code, stderr)
	require.NotContains(t, out+stderr, pw, "a YAML type error in the kafka section")
	require.Contains(t, stderr, "line 2", "the line in the file, not in the section")
}
