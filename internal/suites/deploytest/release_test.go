package deploytest

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// The release this tree is has one name everywhere: CHANGELOG.md's newest
// version (dated, with its link), the Makefile's RELEASE (what make build
// reports where git finds no tag, and make image's tag), the chart's
// appVersion, the Dockerfile's and docker-compose.yml's default VERSION,
// and the local image tags the docs build and run.
func TestReleaseVersionsAgree(t *testing.T) {
	t.Parallel()
	changelog := readFile(t, "CHANGELOG.md")
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindSubmatch(changelog)
	require.NotNil(t, m, "CHANGELOG.md has no dated version (## [X.Y.Z] - YYYY-MM-DD)")
	release := string(m[1])
	require.Regexp(t, `(?m)^## \[Unreleased\]$`, string(changelog), "CHANGELOG.md keeps an [Unreleased] section")
	require.Regexp(t, `(?m)^\[`+regexp.QuoteMeta(release)+`\]: https://github\.com/outbox-relay/outbox-relay/releases/tag/v`+regexp.QuoteMeta(release)+`$`,
		string(changelog), "CHANGELOG.md links [%s] to its tag", release)

	mk := regexp.MustCompile(`(?m)^RELEASE := (\S+)$`).FindSubmatch(readFile(t, "Makefile"))
	require.NotNil(t, mk, "the Makefile sets no RELEASE")
	require.Equal(t, release, string(mk[1]), "the Makefile's RELEASE")

	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, chartDir+"/Chart.yaml"), &chart))
	require.Equal(t, release, chart.AppVersion, "the chart's appVersion (the image tag it deploys by default)")

	df := regexp.MustCompile(`(?m)^ARG\s.*\bVERSION=(\S*)`).FindSubmatch(readFile(t, "Dockerfile"))
	require.NotNil(t, df, "the Dockerfile gives VERSION no default")
	require.Equal(t, release, string(df[1]), "the Dockerfile's default VERSION")

	defaults := regexp.MustCompile(`\$\{VERSION:-([^}]*)\}`).FindAllSubmatch(readFile(t, "docker-compose.yml"), -1)
	require.NotEmpty(t, defaults, "docker-compose.yml names the image by ${VERSION:-...}")
	for _, d := range defaults {
		require.Equal(t, release, string(d[1]), "docker-compose.yml: %s", d[0])
	}

	local := regexp.MustCompile("(?:^|[\\s`])outbox-relay:([^\\s\"'`]+)")
	for _, f := range []string{"README.md", "docs/deploy.md", "Dockerfile", "Makefile"} {
		for _, tag := range local.FindAllSubmatch(readFile(t, f), -1) {
			if string(tag[1]) == "IMAGE_TAG" || string(tag[1]) == "$(IMAGE_TAG)" {
				continue // the Makefile's own variable
			}
			require.Equal(t, release, string(tag[1]), "%s builds or runs the image %s", f, tag[0])
		}
	}
}
