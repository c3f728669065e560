package faults

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
	dir, err := os.MkdirTemp("", "outbox-faults-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults: temp dir:", err)
		os.Exit(1)
	}
	binDir = dir
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// long reports whether the long forms were asked for (FAULTS_LONG=1).
func long() bool { return os.Getenv("FAULTS_LONG") == "1" }

var (
	buildOnce   sync.Once
	buildPath   string
	buildErr    error
	buildTook   time.Duration
	buildLogged sync.Once
)

// relayBinary builds ./cmd/outbox-relay once per test run, from the module
// root and without -race (the relay is the system under test; the race
// detector watches this process), and returns its path.
func relayBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildPath, buildTook, buildErr = relaybin.Build(binDir) })
	if buildErr != nil {
		t.Fatalf("building the relay binary: %v", buildErr)
	}
	buildLogged.Do(func() { t.Logf("relay binary %s (built in %s)", buildPath, buildTook.Round(time.Millisecond)) })
	return buildPath
}
