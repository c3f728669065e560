package testproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCleanupKillsEverything: processes started through the instance, and
// processes that only work in its directory, are gone when the test ends,
// and so is the directory.
func TestCleanupKillsEverything(t *testing.T) {
	t.Parallel()
	var dir string
	var exited []chan error
	t.Run("instance", func(t *testing.T) {
		in, err := New(t, "outbox-testproc-selftest-", "")
		require.NoError(t, err)
		dir = in.Dir
		// One through Command (found by its marker: it works elsewhere),
		// one that only works in the directory and forks a grandchild
		// into a session of its own.
		a := in.Command("sleep", []string{"600"}, nil)
		a.Dir = "/"
		b := exec.Command("sh", "-c", "setsid sleep 600 & wait")
		b.Dir = dir
		for _, c := range []*exec.Cmd{a, b} {
			require.NoError(t, c.Start())
			// Reaped as they die: the cleanup waits until they are gone.
			ch := make(chan error, 1)
			go func() { ch <- c.Wait() }()
			exited = append(exited, ch)
		}
		require.Eventually(t, func() bool { return len(in.Processes()) >= 3 }, 10*time.Second, 10*time.Millisecond, "processes not found")
	})
	for _, ch := range exited {
		require.Error(t, <-ch, "killed")
	}
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "%s left behind", dir)
	require.Empty(t, ProcessesIn(dir))
}

// TestReapStale: an instance whose test process died without running its
// cleanups is killed and removed by the next New with the same prefix;
// one whose test process lives is left alone.
func TestReapStale(t *testing.T) {
	t.Parallel()
	const prefix = "outbox-testproc-reaptest-"
	// A test process that has gone: a child that ran and was reaped.
	gone := exec.Command("sleep", "600")
	require.NoError(t, gone.Start())
	start, err := procStart(gone.Process.Pid)
	require.NoError(t, err)
	require.NoError(t, gone.Process.Kill())
	_ = gone.Wait()

	stale, err := os.MkdirTemp("", prefix)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(stale, ownerFile), []byte(fmt.Sprintf("%d %s\n", gone.Process.Pid, start)), 0o644))
	orphan := exec.Command("sleep", "600")
	orphan.Dir = stale
	require.NoError(t, orphan.Start())
	orphanExit := make(chan error, 1)
	go func() { orphanExit <- orphan.Wait() }()

	live, err := os.MkdirTemp("", prefix)
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(live) })
	self, err := procStart(os.Getpid())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(live, ownerFile), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), self)), 0o644))

	_, err = New(t, prefix, "")
	require.NoError(t, err)
	require.Error(t, <-orphanExit, "the orphan was killed")
	_, err = os.Stat(stale)
	require.True(t, os.IsNotExist(err), "stale instance %s not removed", stale)
	_, err = os.Stat(live)
	require.NoError(t, err, "a live test process's instance was reaped")
}

// TestNotAnInstanceDir: a path that cannot be an instance directory (above
// all an empty one, which as a prefix would match every process) matches
// no process and kills none.
func TestNotAnInstanceDir(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"", "/", os.TempDir(), os.TempDir() + "/", "relative", os.TempDir() + "/a/../.."} {
		require.Empty(t, ProcessesIn(dir), "%q", dir)
		require.Error(t, killAll(dir), "%q", dir)
	}
}
