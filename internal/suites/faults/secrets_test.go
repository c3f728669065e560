package faults

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// TestSecretsNeverPrinted runs the binary with secrets in every place a
// configuration can hold one (database URL, sink URLs, the _FILE form) and
// checks that no output, normal or error, contains them. The local server
// trusts loopback connections, so any password works.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	const pw = "hunter2-Sekr3t"
	u := strings.Replace(pgtest.URL(), "postgres@", "postgres:"+pw+"@", 1)
	require.Contains(t, u, pw, "TEST_DATABASE_URL has an unexpected form: %s", pgtest.URL())
	bad := strings.Replace(u, "127.0.0.1:5432", "127.0.0.1:1", 1) // nothing listens there

	check := func(name string, env []string, args ...string) {
		t.Helper()
		code, stdout, stderr := cliEnv(t, env, args...)
		require.NotContains(t, stdout+stderr, pw, "%s (exit %d) printed the secret", name, code)
		require.NotContains(t, stdout+stderr, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "%s printed the webhook secret", name)
	}
	run := []string{"run", "--schema", schema, "--exit-when-empty", "--admin-addr=", "--log-level", "debug"}
	check("run, URL with password", nil, append(run, "--database-url", u, "--sink", "discard")...)
	check("status, unreachable database", nil, "status", "--database-url", bad, "--schema", schema)
	check("migrate, unreachable database", nil, "migrate", "--database-url", bad, "--schema", schema)
	check("run, kafka SASL password", nil, append(run, "--database-url", u, "--sink", "kafka://relay:"+pw+"@127.0.0.1:1")...)
	check("run, amqp password", nil, append(run, "--database-url", u, "--sink", "amqp://relay:"+pw+"@127.0.0.1:1/?exchange=x")...)
	check("run, webhook secret", nil, append(run, "--database-url", u,
		"--sink", "https://hooks.example.com/h?secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")...)
	check("run, invalid sink option", nil, append(run, "--database-url", u, "--sink", "kafka://relay:"+pw+"@127.0.0.1:1?nope=1")...)
	file := filepath.Join(t.TempDir(), "db-url")
	require.NoError(t, os.WriteFile(file, []byte(u+"\n"), 0o600))
	check("run, OUTBOX_DATABASE_URL_FILE", []string{"OUTBOX_DATABASE_URL_FILE=" + file}, append(run, "--sink", "discard")...)

	// Key/value and query-parameter forms of the same password (fixed, see
	// docs/guarantees.md).
	kv := "host=127.0.0.1 port=5432 user=postgres dbname=test password=" + pw
	q := pgtest.URL() + "?password=" + pw
	for name, args := range map[string][]string{
		"run, key=value DSN":          append(run, "--database-url", kv, "--sink", "discard"),
		"run, ?password= URL":         append(run, "--database-url", q, "--sink", "discard"),
		"status, key=value DSN, down": {"status", "--database-url", strings.Replace(kv, "5432", "1", 1), "--schema", schema},
	} {
		code, stdout, stderr := cliEnv(t, nil, args...)
		leaked := strings.Contains(stdout+stderr, pw)
		t.Logf("%s: exit %d, password printed: %t", name, code, leaked)
		require.False(t, leaked, "%s printed the database password", name)
	}

	// Malformed URLs (issue 20, bug 2): a missing colon or slash, no
	// scheme, an invalid port, a password parameter in upper case (which
	// reaches the server as an unknown setting and fails the connection),
	// and sink URLs of the same shapes. Every one fails; none may print
	// the password, in its error or in a log line before it.
	host := strings.TrimPrefix(pgtest.URL(), "postgres://postgres@")
	fast := append(run, "--connect-timeout", "1s")
	for name, args := range map[string][]string{
		"status, postgres//":           {"status", "--database-url", "postgres//postgres:" + pw + "@" + host},
		"status, postgres:/":           {"status", "--database-url", "postgres:/postgres:" + pw + "@" + host},
		"status, no scheme":            {"status", "--database-url", "postgres:" + pw + "@" + host},
		"status, bad port":             {"status", "--database-url", "postgres://postgres:" + pw + "@127.0.0.1:99999/test"},
		"status, ?PASSWORD=":           {"status", "--database-url", pgtest.URL() + "?PASSWORD=" + pw, "--schema", schema},
		"run, ?PASSWORD=":              append(fast, "--database-url", pgtest.URL()+"?PASSWORD="+pw, "--sink", "discard"),
		"run, ?Password= and sslmode":  append(fast, "--database-url", pgtest.URL()+"?sslmode=disable&Password="+pw, "--sink", "discard"),
		"run, sink https//":            append(run, "--database-url", u, "--sink", "https//u:"+pw+"@hooks.example.com/x"),
		"run, sink kafka//":            append(run, "--database-url", u, "--sink", "kafka//relay:"+pw+"@127.0.0.1:1"),
		"run, sink without scheme":     append(run, "--database-url", u, "--sink", "relay:"+pw+"@127.0.0.1:1"),
		"run, sink path with userinfo": append(run, "--database-url", u, "--sink", "kafka://127.0.0.1:1/relay:"+pw+"@x"),
	} {
		code, stdout, stderr := cliEnv(t, nil, args...)
		leaked := strings.Contains(stdout+stderr, pw)
		t.Logf("%s: exit %d, password printed: %t", name, code, leaked)
		require.NotEqual(t, 0, code, "%s: %s", name, stderr)
		require.False(t, leaked, "%s printed the password:\n%s", name, stderr)
	}
}
