package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A token file that is missing, empty, malformed or readable by others is
// a configuration error naming the flag, found before the relay starts.
func TestAdminTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	good := write("good", "ops:0123456789abcdef0123\n", 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--admin-token-file", filepath.Join(dir, "missing")}, "admin-token-file: open " + filepath.Join(dir, "missing")},
		{[]string{"--admin-token-file", write("empty", "", 0o600)}, "admin-token-file: " + filepath.Join(dir, "empty") + ": no token in the file"},
		{[]string{"--admin-token-file", write("bad", "ops\n", 0o600)}, "line 1: want name:token"},
		{[]string{"--admin-token-file", write("open", "ops:0123456789abcdef0123\n", 0o644)}, "is readable by other users (mode -rw-r--r--): chmod 600 it"},
		{[]string{"--admin-read-token"}, "admin-read-token: needs --admin-token-file"},
		{[]string{"--pprof", "--admin-addr", ""}, "pprof: needs the admin listener"},
		{[]string{"--admin-token-file", good, "--console-sample-interval", "0s"}, "console-sample-interval: must be positive"},
	}
	for _, c := range cases {
		args := append([]string{"run", "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d"}, c.args...)
		code, _, stderr := run(t, args...)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, c.args)
		require.NotContains(t, stderr, "0123456789abcdef", "no token in the error")
	}
}
