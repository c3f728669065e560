package faults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
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
	buildOnce.Do(func() {
		start := time.Now()
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		out := filepath.Join(binDir, "outbox-relay")
		cmd := exec.Command(goTool(), "build", "-o", out, "./cmd/outbox-relay")
		cmd.Dir = root
		var buf bytes.Buffer
		cmd.Stdout = &buf
		cmd.Stderr = &buf
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/outbox-relay in %s: %v\n%s", root, err, buf.String())
			return
		}
		buildPath, buildTook = out, time.Since(start)
	})
	if buildErr != nil {
		t.Fatalf("building the relay binary: %v", buildErr)
	}
	buildLogged.Do(func() { t.Logf("relay binary %s (built in %s)", buildPath, buildTook.Round(time.Millisecond)) })
	return buildPath
}

// goTool finds the go command: go test puts GOROOT/bin first in PATH.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	return "go"
}

// moduleRoot is the directory of the main module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err == nil {
		if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
			return filepath.Dir(gomod), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod found above the test directory")
		}
		dir = parent
	}
}
