// Package relaybin builds the outbox-relay binary for tests that run relays
// as separate processes (the chaos and fault-injection suites). It builds
// without -race: the relays are the system under test, the race detector
// watches the test process.
package relaybin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Build compiles ./cmd/outbox-relay from the module root into dir and
// returns the binary's path and how long the build took.
func Build(dir string) (string, time.Duration, error) {
	start := time.Now()
	root, err := ModuleRoot()
	if err != nil {
		return "", 0, err
	}
	out := filepath.Join(dir, "outbox-relay")
	cmd := exec.Command(goTool(), "build", "-o", out, "./cmd/outbox-relay")
	cmd.Dir = root
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("go build ./cmd/outbox-relay in %s: %v\n%s", root, err, buf.String())
	}
	return out, time.Since(start), nil
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

// ModuleRoot is the directory of the main module's go.mod.
func ModuleRoot() (string, error) {
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
