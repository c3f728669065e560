//go:build !linux

package testproc

import (
	"os/exec"
	"testing"
)

// Instance is the directory and processes of one throwaway server.
type Instance struct {
	// Dir is the instance's private directory.
	Dir string
}

// New returns ErrUnsupported outside Linux.
func New(t testing.TB, prefix, runAs string) (*Instance, error) { return nil, ErrUnsupported }

// Create returns ErrUnsupported outside Linux.
func Create(prefix, runAs string, logf func(format string, args ...any)) (*Instance, error) {
	return nil, ErrUnsupported
}

// Remove is not supported outside Linux.
func (in *Instance) Remove() error { return ErrUnsupported }

// Command is not supported outside Linux.
func (in *Instance) Command(name string, args []string, env []string, drop ...string) *exec.Cmd {
	panic(ErrUnsupported)
}

// Processes is not supported outside Linux.
func (in *Instance) Processes() []int { return nil }

// KillAll is not supported outside Linux.
func (in *Instance) KillAll() error { return ErrUnsupported }

// ProcessesIn is not supported outside Linux.
func ProcessesIn(dir string) []int { return nil }
