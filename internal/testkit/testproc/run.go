package testproc

import (
	"bytes"
	"context"
	"os/exec"
)

// Output starts cmd and returns its combined output once it exits, or
// kills it when ctx ends first (a server it was starting is killed at
// cleanup with the rest of the instance).
func Output(ctx context.Context, cmd *exec.Cmd) (string, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return out.String(), ctx.Err()
	}
}
