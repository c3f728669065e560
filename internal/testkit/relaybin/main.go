package relaybin

import (
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// built is the binary of this test process, built at most once.
var built struct {
	once, logged sync.Once
	dir, path    string
	took         time.Duration
	err          error
}

// Main runs a test package's tests for TestMain, checking for leaked
// goroutines, and removes the binary Binary built, if any.
func Main(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if built.dir != "" {
			_ = os.RemoveAll(built.dir)
		}
		os.Exit(code)
	}))
}

// Binary builds ./cmd/outbox-relay once per test process, into a temporary
// directory that Main removes, and returns its path. It fails tb if the
// build fails.
func Binary(tb testing.TB) string {
	tb.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "outbox-relay-bin-")
		if built.err == nil {
			built.path, built.took, built.err = Build(built.dir)
		}
	})
	if built.err != nil {
		tb.Fatalf("building the relay binary: %v", built.err)
	}
	built.logged.Do(func() { tb.Logf("relay binary %s (built in %s)", built.path, built.took.Round(time.Millisecond)) })
	return built.path
}
