package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A value of the wrong type in the config file names the file, its line
// and the option, and says what the option takes (not Go's strconv text);
// from the environment, the variable; a database URL with a scheme
// Postgres does not take says so, and which it takes.
func TestValueErrorsSayWhereAndWhat(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OUTBOX_DATABASE_URL", "")
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		args       []string
		want       []string
	}{
		{"an integer", "sink: stdout\n\nmax-attempts: five\n", nil, nil,
			[]string{"config " + filepath.Join(dir, "c.yaml") + " line 3: max-attempts:", `"five" is not an integer`}},
		{"a duration", "sink: stdout\nretry-max: 5 minutes\n", nil, nil,
			[]string{"line 2: retry-max:", `"5 minutes" is not a duration such as 30s or 5m`}},
		{"a boolean, spelled with underscores", "sink: stdout\nexit_when_empty: sometimes\n", nil, nil,
			[]string{"line 2: exit-when-empty:", `"sometimes" is not true or false`}},
		{"from the environment", "", map[string]string{"OUTBOX_WORKERS": "many"}, nil,
			[]string{"workers (from OUTBOX_WORKERS):", `"many" is not an integer`}},
		{"a database URL's scheme", "", nil, []string{"--database-url", "postgress://relay:pw@127.0.0.1:5432/app"},
			[]string{`database-url: scheme "postgress" is not one Postgres takes (did you mean "postgres"?)`, "postgres://", "postgresql://"}},
		{"another scheme", "", nil, []string{"--database-url", "mysql://relay:pw@127.0.0.1/app"},
			[]string{`database-url: scheme "mysql"`, "postgres://"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			f := filepath.Join(dir, "c.yaml")
			require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
			args := append([]string{"run", "--sink", "stdout", "--config", f}, tc.args...)
			if tc.args == nil {
				args = append(args, "--database-url", "postgres://x@127.0.0.1:1/d?sslmode=bogus")
			}
			code, _, stderr := run(t, args...)
			require.Equal(t, 2, code, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
			require.NotContains(t, stderr, "strconv")
			require.NotContains(t, stderr, "pw")
		})
	}
}
