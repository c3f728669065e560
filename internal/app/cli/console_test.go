package cli_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/migrations"
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
		{[]string{"--admin-token-file", good, "--admin-read-token", "--admin-open-payloads"}, "admin-read-token, admin-open-payloads: the first makes every read need a token"},
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

// Issue 48: a relay started without console options serves no dead
// letter (they carry the application's payloads and headers) and says
// what to set, while /metrics, /livez, /readyz and the status stay open;
// with a token file the dead letters need one of its tokens; the config
// file's admin-open-payloads serves them to anyone. Three relays of one
// configuration, each with its own admin listener, over real HTTP.
func TestConsoleDeadLettersNeedATokenByDefault(t *testing.T) {
	pool, schema, _ := e2e(t)
	const token = "ops-token-0123456789abcdef"
	_, err := pool.Exec(context.Background(), `INSERT INTO `+migrations.Ident(schema)+`.dead_letters
  (id, message_id, topic, key, payload, headers, created_at, attempts, reason, last_error)
VALUES (1, gen_random_uuid(), 'payments', 'c1', convert_to('{"card":"4111 1111 1111 1111"}', 'UTF8'), '{"x-api-key":"k-123"}', now(), 3, 'permanent', 'HTTP 422')`)
	require.NoError(t, err)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokenFile, []byte("ops:"+token+"\n"), 0o600))
	openFile := filepath.Join(dir, "open.yaml")
	require.NoError(t, os.WriteFile(openFile, []byte("admin-open-payloads: true\n"), 0o600))

	start := func(name string, args ...string) string {
		t.Helper()
		addr := freeAddr(t)
		ctx, stop := context.WithCancel(context.Background())
		logs := &testkit.SyncBuffer{}
		exited := make(chan int, 1)
		go func() {
			exited <- cli.MainContext(ctx, append([]string{"run", "--sink", "discard", "--admin-addr", addr, "--id", name}, args...), io.Discard, logs)
		}()
		t.Cleanup(func() {
			stop()
			require.Equal(t, 0, <-exited, "%s: %s", name, logs.String())
		})
		// Ready: the listener answers and the relay has taken its lanes.
		require.Eventually(t, func() bool {
			res, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == http.StatusOK
		}, 30*time.Second, 20*time.Millisecond, "%s: /readyz; logs:\n%s", name, logs.String())
		return "http://" + addr
	}
	get := func(url string, header ...string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b), res.Header
	}
	deadLetters := []string{"/api/v1/dead-letters", "/api/v1/dead-letters/1", "/ui/dead-letters", "/ui/dead-letters/1"}
	open := []string{"/metrics", "/livez", "/readyz", "/api/v1/status", "/ui/"}

	byDefault := start("default")
	for _, path := range deadLetters {
		code, body, _ := get(byDefault + path)
		require.Equal(t, http.StatusForbidden, code, "%s: %s", path, body)
		require.Contains(t, body, "--admin-token-file", "%s says what to set", path)
		require.Contains(t, body, "--admin-open-payloads", "%s says what to set", path)
		require.NotContains(t, body, "4111", path)
		require.NotContains(t, body, "k-123", path)
	}
	for _, path := range open {
		code, body, _ := get(byDefault + path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}

	withTokens := start("tokens", "--admin-token-file", tokenFile)
	for _, path := range deadLetters {
		code, body, hdr := get(withTokens + path)
		require.Equal(t, http.StatusUnauthorized, code, "%s: %s", path, body)
		require.NotEmpty(t, hdr.Get("WWW-Authenticate"), path)
		require.NotContains(t, body, "4111", path)
		code, body, _ = get(withTokens+path, "Authorization", "Bearer "+token)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
	_, body, _ := get(withTokens+"/api/v1/dead-letters/1", "Authorization", "Bearer "+token)
	require.Contains(t, body, "k-123", "the headers, to a token")
	for _, path := range open {
		code, body, _ := get(withTokens + path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}

	opened := start("open", "--config", openFile)
	for _, path := range deadLetters {
		code, body, _ := get(opened + path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
	_, body, _ = get(opened + "/ui/dead-letters/1")
	require.Contains(t, body, "4111 1111 1111 1111", "the payload, to anyone")
}
