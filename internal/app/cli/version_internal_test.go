package cli

import (
	"bytes"
	"regexp"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// The version and the commit come from -ldflags (make build, the
// Dockerfile) or, without them, from the build information Go records: go
// install module@version records the module's version, a build in a clone
// the commit.
func TestBuildVersion(t *testing.T) {
	t.Parallel()
	const rev = "1d16b85a3c4e9f0b2d7a6c5e4f3b2a1908d7c6b5"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "-trimpath", Value: "true"}, {Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	info := func(v string, settings []debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/outbox-relay/outbox-relay", Version: v}, Settings: settings}
	}
	cases := []struct {
		name                    string
		ldVersion, ldCommit     string
		bi                      *debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{"make build on the tag", "v0.1.0", rev, info("(devel)", nil), "0.1.0", rev},
		{"make build past the tag", "v0.1.0-3-g1d16b85", rev + "-dirty", info("(devel)", vcs("true")), "0.1.0-3-g1d16b85", rev + "-dirty"},
		{"the Dockerfile's defaults", "0.1.0", "", info("(devel)", nil), "0.1.0", "unknown"},
		{"-ldflags win over the build info", "v0.2.0", "abc", info("v0.1.0", vcs("false")), "0.2.0", "abc"},
		{"go install module@v0.1.0", "", "", info("v0.1.0", nil), "0.1.0", "unknown"},
		{"go install module@commit", "", "", info("v0.1.1-0.20261128093000-1d16b85a3c4e", nil), "0.1.1-0.20261128093000-1d16b85a3c4e", "1d16b85a3c4e"},
		{"go install module@commit before a tag", "", "", info("v0.0.0-20261128093000-1d16b85a3c4e", nil), "0.0.0-20261128093000-1d16b85a3c4e", "1d16b85a3c4e"},
		{"go build in a clone on the tag", "", "", info("v0.1.0", vcs("false")), "0.1.0", rev},
		{"go build in a changed clone", "", "", info("v0.1.1-0.20261128093000-1d16b85a3c4e+dirty", vcs("true")), "0.1.1-0.20261128093000-1d16b85a3c4e+dirty", rev + "-dirty"},
		{"go build with -buildvcs=false", "", "", info("(devel)", nil), "dev", "unknown"},
		{"no build info", "", "", nil, "dev", "unknown"},
		{"a version that is not vX", "", "", info("vnext", nil), "vnext", "unknown"},
	}
	for _, c := range cases {
		v, commit := buildVersion(c.ldVersion, c.ldCommit, c.bi)
		require.Equal(t, c.wantVersion, v, c.name)
		require.Equal(t, c.wantCommit, commit, c.name)
	}
}

// The version command prints both, on the line the Dockerfile's test and
// scripts read: outbox-relay VERSION (commit COMMIT, schema version N, goX).
// It sets the package's Version and Commit, so it runs alone (not in
// parallel), as make build's -ldflags would.
func TestVersionCommand(t *testing.T) {
	line := regexp.MustCompile(`^outbox-relay (\S+) \(commit (\S+), schema version \d+, go\S+\)\n$`)
	printed := func() []string {
		t.Helper()
		var out bytes.Buffer
		root := newRoot(&globals{stdout: &out, stderr: &out})
		root.SetArgs([]string{"version"})
		root.SetOut(&out)
		require.NoError(t, root.Execute())
		m := line.FindStringSubmatch(out.String())
		require.NotNil(t, m, "outbox-relay version printed %q", out.String())
		return m[1:]
	}
	// A test binary: its build information names no module version and
	// no commit.
	bi, _ := debug.ReadBuildInfo()
	v, commit := buildVersion("", "", bi)
	require.Equal(t, []string{v, commit}, printed())

	oldVersion, oldCommit := Version, Commit
	t.Cleanup(func() { Version, Commit = oldVersion, oldCommit })
	Version, Commit = "v0.1.0", "1d16b85a3c4e9f0b2d7a6c5e4f3b2a1908d7c6b5"
	require.Equal(t, []string{"0.1.0", Commit}, printed())
	require.Equal(t, "0.1.0", version(), "what the relays table, the console and the build-info metric say")
}
