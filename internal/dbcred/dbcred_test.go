//go:build unix

package dbcred

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a fake clock for a Source's deadlines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// concurrently calls s.Password n times at once, as a pool opening n
// connections does, and returns what each got.
func concurrently(t *testing.T, s *Source, n int) []string {
	t.Helper()
	out := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = s.Password(context.Background()) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

func password(t *testing.T, s *Source) string {
	t.Helper()
	pw, err := s.Password(context.Background())
	require.NoError(t, err)
	return pw
}

func sourceErr(t *testing.T, s *Source) string {
	t.Helper()
	_, err := s.Password(context.Background())
	require.Error(t, err)
	return err.Error()
}

// A password file is read again for every connection: a rewrite is seen
// by the next one, whatever the clock says; its trailing newline is not
// part of the password.
func TestFileReadForEveryConnection(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(path, []byte("first-pw\n"), 0o600))
	s := File(path)
	c := newClock()
	s.now = c.now
	require.Equal(t, "first-pw", password(t, s))
	// A secret manager writes the new file beside the old one and renames
	// it over (Kubernetes' projected volumes swap a symlink).
	next := path + ".new"
	require.NoError(t, os.WriteFile(next, []byte("second-pw\r\n"), 0o600))
	require.NoError(t, os.Rename(next, path))
	require.Equal(t, "second-pw", password(t, s), "the rewritten file, at the same instant")
	require.NoError(t, os.WriteFile(path, []byte("third-pw"), 0o600))
	require.Equal(t, []string{"third-pw", "third-pw", "third-pw"}, concurrently(t, s, 3))
}

// What a password file must be, and errors that name the option and the
// file but never quote what the file holds.
func TestFileRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const secret = "S3cr3t-in-the-file"
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "absent"), "no such file or directory"},
		{"empty", write("empty", ""), "is empty"},
		{"newline only", write("newline", "\n"), "is empty"},
		{"two lines", write("two", secret+"\nsecond line\n"), "holds more than one line"},
		{"control character", write("nul", secret+"\x00tail"), "holds more than one line or control characters"},
		{"a directory", dir, "is not a regular file"},
		{"a FIFO nobody writes to", fifo, "is not a regular file"},
		{"too large", write("large", strings.Repeat("x", maxFileBytes+1)), "is larger than 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := sourceErr(t, File(tc.path))
			require.Contains(t, msg, "database-password-file: ")
			require.Contains(t, msg, tc.path)
			require.Contains(t, msg, tc.want)
			require.NotContains(t, msg, secret)
		})
	}
}

// A command runs once for connections opened together, and again once
// its password is older than CommandReuse: not per connection.
func TestCommandReusedBriefly(t *testing.T) {
	t.Parallel()
	count := filepath.Join(t.TempDir(), "runs")
	// Each run counts itself and prints its number in the password.
	line := `n=$(cat '` + count + `' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '` + count + `'; echo "pw-$n"`
	runs := func() int {
		b, err := os.ReadFile(count)
		require.NoError(t, err)
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return n
	}
	s := Command(line)
	c := newClock()
	s.now = c.now
	require.Equal(t, []string{"pw-1", "pw-1", "pw-1", "pw-1", "pw-1", "pw-1", "pw-1"}, concurrently(t, s, 7))
	require.Equal(t, 1, runs(), "a pool of 7 connections ran the command more than once")
	c.add(CommandReuse - time.Millisecond)
	require.Equal(t, "pw-1", password(t, s))
	require.Equal(t, 1, runs())
	c.add(time.Millisecond)
	require.Equal(t, "pw-2", password(t, s), "the password is fetched again once CommandReuse has passed")
	require.Equal(t, 2, runs())
}

// A failed command says why (its exit status and stderr) and never what
// it printed on stdout; a failure is not kept, so the next connection
// runs the command again.
func TestCommandFailures(t *testing.T) {
	t.Parallel()
	const secret = "S3cr3t-on-stdout"
	for _, tc := range []struct {
		name, line string
		want       []string
	}{
		{"exit status", `echo "` + secret + `"; echo "permission denied: database/static-creds/relay" >&2; exit 3`,
			[]string{"exit status 3", "(stderr: permission denied: database/static-creds/relay)"}},
		{"not found", `no-such-password-tool-xyz`, []string{"exit status 127", "not found"}},
		{"empty output", `true`, []string{"the output is empty"}},
		{"two lines", `printf '%s\nmore\n' "` + secret + `"`, []string{"the output holds more than one line"}},
		{"endless output", `yes "` + secret + `" | head -c 1000000`, []string{"the output is larger than 65536 bytes"}},
		{"endless stderr", `yes "warning" | head -c 100000 >&2; exit 2`, []string{"exit status 2 (stderr: warning warning", "…)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg := sourceErr(t, Command(tc.line))
			require.True(t, strings.HasPrefix(msg, "database-password-command: "), msg)
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
			require.NotContains(t, msg, secret)
		})
	}

	t.Run("not kept", func(t *testing.T) {
		t.Parallel()
		flag := filepath.Join(t.TempDir(), "ready")
		s := Command(`test -f '` + flag + `' && echo pw || { echo "not ready" >&2; exit 1; }`)
		c := newClock()
		s.now = c.now
		require.Contains(t, sourceErr(t, s), "not ready")
		require.NoError(t, os.WriteFile(flag, nil, 0o600))
		require.Equal(t, "pw", password(t, s), "the next connection runs the command again")
	})

	t.Run("the connection gives up", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := Command(`echo waiting >&2; sleep 30`).Password(ctx)
		require.Error(t, err)
		require.Contains(t, err.Error(), "database-password-command: stopped: context deadline exceeded")
		require.Less(t, time.Since(start), 10*time.Second, "the command outlived the connection attempt")
	})
}
