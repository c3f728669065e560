package chaos

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/relaybin"
)

// binDir holds the relay binary built for this test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: temp dir:", err)
		os.Exit(1)
	}
	binDir = dir
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	buildTook time.Duration
)

// relayBinary builds ./cmd/outbox-relay once per test run (without -race:
// the relays are the system under test, the race detector watches the test
// process) and returns its path.
func relayBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() { buildPath, buildTook, buildErr = relaybin.Build(binDir) })
	if buildErr != nil {
		t.Fatalf("building the relay binary: %v", buildErr)
	}
	t.Logf("relay binary %s (built in %s)", buildPath, buildTook.Round(time.Millisecond))
	return buildPath
}
