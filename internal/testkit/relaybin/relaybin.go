// Package relaybin builds the outbox-relay binary for tests that run relays
// as separate processes (the chaos and fault-injection suites). It builds
// without -race: the relays are the system under test, the race detector
// watches the test process.
//
// It builds the way the Dockerfile and make build do (StaticEnv and
// StaticFlags): the relays under test are the static binary users run,
// and every build of the suite shares one set of compiled packages in
// the build cache. Built with other settings, each way compiled the
// standard library and every dependency again: about 2 CPU minutes each
// on a machine whose cache was empty (measured: go build of
// ./cmd/outbox-relay with an empty GOCACHE, 96 s user + 23 s system),
// and -trimpath lets a fresh clone reuse the module's own packages.
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

// StaticEnv and StaticFlags are the settings of every build of the
// binaries: a static binary (no cgo), without the builder's paths.
// internal/suites/deploytest checks that the Dockerfile's build step and
// the Makefile's build target use them.
var (
	StaticEnv   = []string{"CGO_ENABLED=0"}
	StaticFlags = []string{"-trimpath"}
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
	args := append(append([]string{"build"}, StaticFlags...), "-o", out, "./cmd/outbox-relay")
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), StaticEnv...)
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
