package testkit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func startShell(t *testing.T, script string, stderr *SyncBuffer) *Relay {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		Unavailable(t, "tool", "sh: %v", err)
	}
	r, err := StartRelay(context.Background(), RelayConfig{Bin: sh, Args: []string{"-c", script}, Stderr: stderr, StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

func TestRelaySpeaksAndStops(t *testing.T) {
	var stderr SyncBuffer
	r := startShell(t, `trap 'exit 0' TERM; echo up >&2; while :; do sleep 0.05; done`, &stderr)
	select {
	case <-r.Spoke():
	case <-r.Done():
		t.Fatalf("exited before it spoke: %v", r.Err())
	case <-time.After(30 * time.Second):
		t.Fatal("no output within 30s")
	}
	if !r.Alive() || r.ExitCode() != -1 || r.State() != nil {
		t.Fatal("a running process reads as exited")
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.Alive() || r.ExitCode() != 0 || r.Err() != nil {
		t.Fatalf("after Stop: alive %v, exit %d, err %v", r.Alive(), r.ExitCode(), r.Err())
	}
	if got := stderr.String(); got != "up\n" {
		t.Fatalf("stderr %q", got)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestRelayEndsWithItsContext(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		Unavailable(t, "tool", "sh: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, err := StartRelay(ctx, RelayConfig{Bin: sh, Args: []string{"-c", `trap 'exit 3' TERM; echo up >&2; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	<-r.Spoke() // the trap is set
	cancel()
	if !r.Wait(30 * time.Second) {
		_ = r.Stop()
		t.Fatal("still running 30s after its context ended")
	}
	if r.ExitCode() != 3 {
		t.Fatalf("exit %d, want 3 (SIGTERM, then the trap)", r.ExitCode())
	}
}

func TestRelaySpeaksIntoAFile(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		Unavailable(t, "tool", "sh: %v", err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := StartRelay(context.Background(), RelayConfig{Bin: sh, Args: []string{"-c", `trap 'exit 0' TERM; echo up >&2; while :; do sleep 0.05; done`}, Stderr: f})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Spoke():
	case <-r.Done():
		t.Fatalf("exited before it spoke: %v", r.Err())
	case <-time.After(30 * time.Second):
		_ = r.Stop()
		t.Fatal("no output within 30s")
	}
	if err := r.Stop(); err != nil || r.ExitCode() != 0 {
		t.Fatalf("Stop: %v, exit %d", err, r.ExitCode())
	}
}
