package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigFileStrictness covers the config file's silent cases (issue 20,
// bug 10): a duplicate key, a second YAML document and a sink section that
// does not belong to the sink are refused with exit 2 and an error naming
// the line or the section; a secret file others can read is accepted with
// a warning naming its path and mode.
func TestConfigFileStrictness(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	dir := t.TempDir()
	// sslmode=bogus: a config that passes every check fails on the
	// database URL, before any connection.
	db := "postgres://x@127.0.0.1:1/d?sslmode=bogus"
	for _, tc := range []struct {
		name, yaml string
		args       []string
		want       []string
	}{
		{"duplicate key", "schema: a\nworkers: 2\nschema: b\n", nil,
			[]string{"line 3", `"schema"`, "line 1"}},
		{"duplicate key, other spelling", "batch-size: 10\nbatch_size: 20\n", nil,
			[]string{"line 2", "batch_size", "line 1"}},
		{"duplicate key in a sink section", "kafka:\n  client_id: a\n  tls: {enable: true}\n  client_id: b\n", nil,
			[]string{"line 4", `"client_id"`, "line 2"}},
		{"duplicate key in a route", "routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n    name: b\n", nil,
			[]string{"line 5", `"name"`, "line 2"}},
		{"second document", "schema: a\n---\nschema: b\n", nil,
			[]string{"line 2", "second YAML document"}},
		{"http section, kafka sink", "sink: kafka://127.0.0.1:9092\nhttp:\n  timeout: 5s\n", []string{"run"},
			[]string{"line 2", "http", `"kafka"`}},
		{"kafka section, stdout sink", "kafka:\n  client_id: a\n", []string{"run", "--sink", "stdout"},
			[]string{"line 1", "kafka", `"stdout"`}},
		{"amqp section in an http route", "routes:\n  - name: a\n    topics: [x]\n    sink: https://h.example.com/x\n    amqp: {exchange: e}\n", []string{"run"},
			[]string{"line 5", "routes[0].amqp", `"https"`}},
		{"unknown key in a route", "routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n    kafak: {}\n", []string{"run"},
			[]string{"line 5", "routes[0].kafak", `unknown key "kafak" in routes[0] (did you mean "kafka"?)`}},
		{"unknown key in a route, no Go type named", "routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n    worker: 2\n", []string{"run"},
			[]string{"line 5", "routes[0].worker", `(did you mean "workers"?)`, "known keys: amqp, batch-bytes"}},
		{"unknown key in a nested section names the section, not a Go type", "sink: http://127.0.0.1:9/hook\nhttp:\n  timeout: 5s\n  secret: abc\n", []string{"run"},
			[]string{"line 4", `http.secret: unknown key "secret" in section http (did you mean "secrets"?)`}},
		{"top-level section no route uses", "http:\n  timeout: 5s\nroutes:\n  - name: a\n    topics: [x]\n    sink: stdout\n", []string{"run"},
			[]string{"line 1", "http", "no route"}},
		{"unknown key in a sink section", "sink: kafka://127.0.0.1:9092\nschema: s\n\nkafka:\n  client_id: a\n  tls:\n    enabel: true\n", []string{"run"},
			[]string{"line 7", "kafka.tls.enabel", `in section kafka.tls (did you mean "enable"?)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, "c.yaml")
			require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
			args := tc.args
			if args == nil {
				args = []string{"migrate", "--print"}
			}
			code, _, stderr := run(t, append(args, "--config", f, "--database-url", db)...)
			require.Equal(t, 2, code, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
		})
	}

	// Sections that do belong to their sink are still accepted: a top-level
	// section serves as the default of every route of its kind.
	f := filepath.Join(dir, "ok.yaml")
	require.NoError(t, os.WriteFile(f, []byte("http:\n  timeout: 5s\nkafka:\n  client_id: a\nroutes:\n"+
		"  - {name: a, topics: [x], sink: 'https://h.example.com/x'}\n"+
		"  - {name: b, topics: [y], sink: 'kafka://127.0.0.1:1', kafka: {client_id: b}}\n"), 0o600))
	code, _, stderr := run(t, "run", "--config", f, "--database-url", "postgres://x@127.0.0.1:1/d?sslmode=bogus")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "database-url: cannot parse", "the config passed every check before the database")

	// A secret file others can read: accepted, with a warning.
	secret := filepath.Join(dir, "database-url")
	require.NoError(t, os.WriteFile(secret, []byte("postgres://relay:pw@127.0.0.1:1/d\n"), 0o644))
	require.NoError(t, os.Chmod(secret, 0o644))
	unsetenv(t, "OUTBOX_DATABASE_URL") // set, even empty, it would win over its _FILE
	t.Setenv("OUTBOX_DATABASE_URL_FILE", secret)
	code, _, stderr = run(t, "migrate", "--print")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "level=WARN")
	require.Contains(t, stderr, secret)
	require.Contains(t, stderr, "-rw-r--r--")
	for _, mode := range []os.FileMode{0o600, 0o640} {
		require.NoError(t, os.Chmod(secret, mode))
		code, _, stderr = run(t, "migrate", "--print")
		require.Equal(t, 0, code, stderr)
		require.NotContains(t, stderr, "WARN", "%v: only the owner and this process's group can read it", mode)
	}
	// Readable by a group this process is not in (needs root to chown).
	if err := os.Chown(secret, -1, 4242); err != nil {
		t.Logf("not checking a foreign group: chown: %v", err)
		return
	}
	code, _, stderr = run(t, "migrate", "--print")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "-rw-r-----")
}
