package cli_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Issue 35, finding 10: a secret file wired to the wrong option came back
// in that option's parse error (`parsing "S3cr3tPassw0rd"`), or in every
// log line through OUTBOX_ID_FILE. Only the options that hold secrets
// (database-url, sink) read a *_FILE; the others' twins are refused unread,
// naming the variable.
func TestFileTwinOfNonSecretOptionRefusedUnread(t *testing.T) {
	const secret = "S3cr3tPassw0rd"
	f := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(f, []byte(secret+"\n"), 0o600))
	t.Setenv("DATABASE_URL", "postgres://x@127.0.0.1:1/d")
	for _, env := range []string{"OUTBOX_WORKERS_FILE", "OUTBOX_LOG_LEVEL_FILE", "OUTBOX_ADMIN_ADDR_FILE", "OUTBOX_ID_FILE", "OUTBOX_SCHEMA_FILE", "OUTBOX_CONFIG_FILE"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, f)
			code, out, stderr := run(t, "run", "--sink", "stdout", "--connect-timeout", "1ms")
			require.Equal(t, 2, code, stderr)
			require.NotContains(t, out+stderr, secret)
			require.Contains(t, stderr, env+": ")
			require.Contains(t, stderr, "is not a secret and is not read from a file (only database-url and sink are)")
		})
	}
}

// The options that do read a *_FILE never print what they read, in any
// error: not a password-only file, not /proc/self/environ (which printed
// the whole environment), even where the option's own error would show
// its value.
func TestFileSecretsNeverInErrors(t *testing.T) {
	const secret = "S3cr3tPassw0rd"
	dir := t.TempDir()
	plain := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(plain, []byte(secret+"\n"), 0o600))
	// A URL the driver cannot parse, whose redacted form is printed for a
	// URL from the environment.
	require.NoError(t, os.WriteFile(plain+"-url", []byte("postgres://relay:"+secret+"@127.0.0.1:1/d?sslmode=bogus\n"), 0o600))
	// What /proc/self/environ holds: NUL-separated variables (the test's
	// own environ does not hold the secret, so a copy of its form).
	environ := filepath.Join(dir, "environ")
	require.NoError(t, os.WriteFile(environ, []byte("HOME=/root\x00PASSWORD="+secret+"\x00PATH=/bin\x00"), 0o600))
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"sink, not a URL", []string{"OUTBOX_SINK_FILE=" + plain, "DATABASE_URL=postgres://x@127.0.0.1:1/d"}, []string{"run", "--connect-timeout", "1ms"}},
		{"sink, environ", []string{"OUTBOX_SINK_FILE=" + environ, "DATABASE_URL=postgres://x@127.0.0.1:1/d"}, []string{"run", "--connect-timeout", "1ms"}},
		{"database-url, not a URL", []string{"OUTBOX_DATABASE_URL_FILE=" + plain}, []string{"status"}},
		{"database-url, environ", []string{"DATABASE_URL_FILE=" + environ}, []string{"status"}},
		{"database-url, /proc/self/environ", []string{"DATABASE_URL_FILE=/proc/self/environ"}, []string{"status"}},
		{"database-url, bad URL", []string{"OUTBOX_DATABASE_URL_FILE=" + plain + "-url"}, []string{"run", "--sink", "stdout", "--connect-timeout", "1ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(strings.Join(tc.env, " "), "/proc/") && runtime.GOOS != "linux" {
				t.Skip("no /proc/self/environ on " + runtime.GOOS)
			}
			unsetenv(t, "DATABASE_URL")
			unsetenv(t, "OUTBOX_DATABASE_URL")
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			code, out, stderr := run(t, tc.args...)
			require.NotEqual(t, 0, code, stderr)
			require.NotContains(t, out+stderr, secret)
			require.NotContains(t, out+stderr, "PATH=", "no line of an environ")
			require.Contains(t, stderr, "_FILE", "the error names the variable")
		})
	}
}

// unsetenv unsets k for the rest of the test (t.Setenv restores it).
func unsetenv(t *testing.T, k string) {
	t.Helper()
	t.Setenv(k, "")
	require.NoError(t, os.Unsetenv(k))
}

// A *_FILE, --config or --admin-token-file that is no regular file is
// refused by what it is: /dev/zero ran out of memory, a FIFO blocked the
// start-up (and SIGTERM) for as long as nobody wrote to it.
func TestFilesMustBeRegular(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no FIFOs or /dev/zero on windows")
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, make([]byte, 1<<20+1), 0o600))
	t.Setenv("DATABASE_URL", "postgres://x@127.0.0.1:1/d")
	for _, tc := range []struct {
		name string
		env  string // VAR=path, or "" for an argument
		args []string
		want string
	}{
		{"sink /dev/zero", "OUTBOX_SINK_FILE=/dev/zero", nil, "OUTBOX_SINK_FILE: /dev/zero is a character device, not a regular file"},
		{"config /dev/zero", "", []string{"--config", "/dev/zero"}, "config: /dev/zero is a character device, not a regular file"},
		{"sink FIFO", "OUTBOX_SINK_FILE=" + fifo, nil, "OUTBOX_SINK_FILE: " + fifo + " is a FIFO (named pipe), not a regular file"},
		{"config FIFO", "", []string{"--config", fifo}, "config: " + fifo + " is a FIFO (named pipe), not a regular file"},
		{"OUTBOX_CONFIG FIFO", "OUTBOX_CONFIG=" + fifo, nil, "config: " + fifo + " is a FIFO"},
		{"database-url directory", "OUTBOX_DATABASE_URL_FILE=" + dir, nil, "OUTBOX_DATABASE_URL_FILE: " + dir + " is a directory, not a regular file"},
		{"token file FIFO", "", []string{"--admin-token-file", fifo}, "admin-token-file: " + fifo + " is a FIFO"},
		{"sink too large", "OUTBOX_SINK_FILE=" + big, nil, "OUTBOX_SINK_FILE: " + big + " is larger than 65536 bytes"},
		{"config too large", "", []string{"--config", big}, "config: " + big + " is larger than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				k, v, _ := strings.Cut(tc.env, "=")
				t.Setenv(k, v)
			}
			args := append([]string{"run", "--sink", "stdout", "--connect-timeout", "1ms"}, tc.args...)
			if strings.HasPrefix(tc.env, "OUTBOX_SINK_FILE") {
				args = append([]string{"run", "--connect-timeout", "1ms"}, tc.args...)
			}
			type result struct {
				code   int
				stderr string
			}
			done := make(chan result, 1)
			go func() {
				code, _, stderr := run(t, args...)
				done <- result{code, stderr}
			}()
			select {
			case r := <-done:
				require.Equal(t, 2, r.code, r.stderr)
				require.Contains(t, r.stderr, tc.want)
			case <-time.After(time.Minute):
				// Not a speed bound: a blocked open never returns.
				t.Fatalf("%s: start-up still blocked after a minute", tc.name)
			}
		})
	}
}
