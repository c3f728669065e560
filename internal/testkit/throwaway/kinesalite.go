package throwaway

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// KinesaliteVersion is the kinesalite (a Kinesis server, from npm) that
// scripts/services.sh installs.
const KinesaliteVersion = "3.3.3"

// KinesaliteDir is where scripts/services.sh installs kinesalite
// (npm install --prefix DIR): kinesalite under the user's cache
// directory ($XDG_CACHE_HOME or ~/.cache), outbox-relay/kinesalite.
func KinesaliteDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = filepath.Join(os.TempDir(), ".cache")
	}
	return filepath.Join(dir, "outbox-relay", "kinesalite")
}

// Kinesalite starts kinesalite on a free port, with its LevelDB store in
// a temporary directory: what it acknowledged survives Kill, and Start
// brings it back on the same port with its streams and records. Streams
// are created, deleted and updated at once (no CREATING state to wait
// out). It is killed when the test ends. Its URL is the endpoint
// (http://127.0.0.1:port).
func Kinesalite(tb testing.TB) *Server {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testkit.Unavailable(tb, "tool", "node not installed (scripts/services.sh kinesalite installs nodejs and kinesalite): %v", err)
	}
	cli := filepath.Join(KinesaliteDir(), "node_modules", "kinesalite", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		testkit.Unavailable(tb, "tool", "kinesalite not installed: run scripts/services.sh kinesalite "+
			"(npm install --prefix %s kinesalite@%s): %v", KinesaliteDir(), KinesaliteVersion, err)
	}
	s := &Server{tb: tb, name: "kinesalite", bin: node, port: freePort(tb), dir: tb.TempDir()}
	tb.Cleanup(s.Kill)
	s.args = []string{cli, "--port", strconv.Itoa(s.port), "--path", filepath.Join(s.dir, "db"),
		"--createStreamMs", "0", "--deleteStreamMs", "0", "--updateStreamMs", "0", "--shardLimit", "1000"}
	s.Start()
	return s
}
