package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
)

// Issue 48: outbox-relay version prints the version and the commit a real
// binary was built from, both ways it is built from a clone: go build (as
// go install does) takes them from the build information Go records, make
// build sets them with -ldflags from git. Both name the same commit.
func TestVersionOfBuiltBinaries(t *testing.T) {
	t.Parallel()
	root, err := relaybin.ModuleRoot()
	require.NoError(t, err)
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0") // read, never touch the index
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse HEAD: %v): the commit comes from git", err)
	}
	line := regexp.MustCompile(`^outbox-relay (\S+) \(commit (\S+), schema version \d+, go\S+\)\n$`)
	version := func(bin string) (string, string) {
		t.Helper()
		out, err := exec.Command(bin, "version").CombinedOutput()
		require.NoError(t, err, "%s", out)
		m := line.FindStringSubmatch(string(out))
		require.NotNil(t, m, "outbox-relay version printed %q", out)
		return m[1], m[2]
	}

	// -buildvcs=true: what go build and go install do in a clone by
	// default (auto), whatever GOFLAGS this machine's go env sets.
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "go test puts GOROOT/bin in PATH")
	plain := filepath.Join(t.TempDir(), "outbox-relay")
	// Built with the suite's static settings, which change nothing in
	// what Go records and share the compiled packages of the relays'.
	args := append(append([]string{"build", "-buildvcs=true"}, relaybin.StaticFlags...), "-o", plain, "./cmd/outbox-relay")
	build := exec.Command(goTool, args...)
	build.Dir = root
	build.Env = append(append(os.Environ(), "GIT_OPTIONAL_LOCKS=0"), relaybin.StaticEnv...)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	v, commit := version(plain)
	require.Regexp(t, "^"+head+"(-dirty)?$", commit, "go build: vcs.revision, -dirty with changes")
	require.NotEqual(t, "dev", v, "go build in a clone records a version")

	bin := t.TempDir()
	cmd := exec.Command("make", "-s", "build", "BIN="+bin)
	cmd.Dir = root
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "VERSION" && k != "COMMIT" && k != "MAKEFLAGS" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "GIT_OPTIONAL_LOCKS=0")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "make build: %s", out)
	v, made := version(filepath.Join(bin, "outbox-relay"))
	require.Equal(t, commit, made, "make build and go build name the same commit, dirty or not")
	want, err := git("describe", "--tags", "--match", "v[0-9]*")
	if err != nil { // no tag: the Makefile's RELEASE
		mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
		require.NoError(t, err)
		m := regexp.MustCompile(`(?m)^RELEASE := (\S+)$`).FindSubmatch(mk)
		require.NotNil(t, m, "the Makefile sets no RELEASE")
		want = string(m[1])
	}
	require.Equal(t, strings.TrimPrefix(want, "v"), v, "make build: git describe, or the release where git finds no tag")
}
