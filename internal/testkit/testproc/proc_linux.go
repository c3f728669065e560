//go:build linux

package testproc

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// markerVar is set in the environment of every command an Instance runs.
// Its value is the instance's directory, so the processes of an instance
// can be found even when they changed process group or session (Erlang's
// port programs, epmd) or forked from a daemon.
const markerVar = "OUTBOX_TESTPROC"

// ownerFile in an instance directory names the process that owns it:
// "pid starttime", starttime from /proc/<pid>/stat (pids are reused).
const ownerFile = "owner"

// Instance is the directory and processes of one throwaway server.
type Instance struct {
	// Dir is the instance's private directory, removed at cleanup. It is
	// owned by the instance's user.
	Dir  string
	cred *syscall.Credential
}

// New creates an instance directory named after prefix in the system's
// temporary directory and registers the cleanup that kills the instance's
// processes and removes the directory. Register the server's own cleanups
// after New: they run first.
//
// runAs names the OS user the server must run as when the test runs as
// root (initdb and postgres refuse root); it is ignored otherwise. Empty:
// the test's own user.
func New(t testing.TB, prefix, runAs string) (*Instance, error) {
	t.Helper()
	in, err := Create(prefix, runAs, t.Logf)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := in.Remove(); err != nil {
			t.Errorf("throwaway server in %s: %v", in.Dir, err)
		}
	})
	return in, nil
}

// Create is New for a caller that is not a test (a benchmark): the
// instance is the caller's to Remove. Instances of prefix whose owning
// process is gone are reaped first; logf (nil: silent) says so.
func Create(prefix, runAs string, logf func(format string, args ...any)) (*Instance, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	reapStale(prefix, logf)
	var cred *syscall.Credential
	if runAs != "" && os.Geteuid() == 0 {
		u, err := user.Lookup(runAs)
		if err != nil {
			return nil, fmt.Errorf("running as root, the server must run as OS user %q: %w", runAs, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	in := &Instance{Dir: dir, cred: cred}
	if err := in.own(); err != nil {
		_ = in.Remove()
		return nil, err
	}
	return in, nil
}

// own writes the owner file (this process) and hands the directory to the
// instance's user.
func (in *Instance) own() error {
	self, err := procStart(os.Getpid())
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(in.Dir, ownerFile), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), self)), 0o644); err != nil {
		return err
	}
	if in.cred != nil {
		return os.Chown(in.Dir, int(in.cred.Uid), int(in.cred.Gid))
	}
	return nil
}

// Remove kills every process of the instance and removes its directory.
func (in *Instance) Remove() error {
	err := in.KillAll()
	if rerr := os.RemoveAll(in.Dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("removing %s: %w", in.Dir, rerr))
	}
	return err
}

// Command returns a command that runs as the instance's user, in the
// instance's directory, in a process group of its own, with the
// instance's marker and env added to this process's environment (minus
// variables starting with one of the drop prefixes).
func (in *Instance) Command(name string, args []string, env []string, drop ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = in.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: in.cred}
	for _, kv := range os.Environ() {
		keep := !strings.HasPrefix(kv, markerVar+"=")
		for _, p := range drop {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Env = append(cmd.Env, markerVar+"="+in.Dir)
	return cmd
}

// Processes returns the pids of the instance's processes: those carrying
// its marker in their environment, and those whose working directory is
// inside its directory (PostgreSQL overwrites its children's environment
// with their process titles, but they all work in the data directory).
func (in *Instance) Processes() []int { return ProcessesIn(in.Dir) }

// KillAll sends SIGKILL to every process of the instance, again until
// none is left (a dying server may still fork), and returns once they are
// gone. A process this test started is gone only when its Wait returns:
// have a goroutine waiting for it, or KillAll waits in vain for 30s.
func (in *Instance) KillAll() error { return killAll(in.Dir) }

// ProcessesIn returns the pids of the processes of the instance whose
// directory is (or was) dir. dir must be an instance directory: anything
// else that is not absolute and below the temporary directory matches
// nothing (an empty dir would otherwise match every process).
func ProcessesIn(dir string) []int {
	if !isInstanceDir(dir) {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	marker := []byte(markerVar + "=" + dir + "\x00")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p := filepath.Join("/proc", e.Name())
		if cwd, err := os.Readlink(filepath.Join(p, "cwd")); err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			pids = append(pids, pid)
			continue
		}
		if env, err := os.ReadFile(filepath.Join(p, "environ")); err == nil && bytes.Contains(env, marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAll(dir string) error {
	if !isInstanceDir(dir) {
		return fmt.Errorf("refusing to kill the processes of %q: not an instance directory", dir)
	}
	// There is no signal for the death of a process that is not our
	// child, so look again until /proc has none left.
	// A killed process is gone only once its parent has reaped it: until
	// then its pid still answers kill(pid, 0), and a postmaster started
	// on the same data directory takes the zombie for a running server.
	deadline := time.Now().Add(30 * time.Second)
	killed := map[int]bool{}
	for {
		for _, pid := range ProcessesIn(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed[pid] = true
		}
		for pid := range killed {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
				delete(killed, pid)
			}
		}
		if len(killed) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still there 30s after SIGKILL", slices.Sorted(maps.Keys(killed)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isInstanceDir reports whether dir can be an instance directory: a
// clean absolute path strictly inside the temporary directory.
func isInstanceDir(dir string) bool {
	tmp := filepath.Clean(os.TempDir())
	return filepath.IsAbs(dir) && filepath.Clean(dir) == dir && strings.HasPrefix(dir, tmp+"/") && len(dir) > len(tmp)+1
}

// procStart returns the start time of pid (field 22 of /proc/<pid>/stat).
func procStart(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("short /proc/%d/stat", pid)
	}
	return f[19], nil
}

// reapStale kills the processes of, and removes, instance directories
// whose owning process is gone.
func reapStale(prefix string, logf func(format string, args ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created, or not ours
		}
		var pid int
		var start string
		if _, err := fmt.Sscanf(string(b), "%d %s", &pid, &start); err != nil {
			continue
		}
		if now, err := procStart(pid); err == nil && now == start {
			continue // its process is still running
		}
		err = killAll(dir)
		if err == nil {
			err = os.RemoveAll(dir)
		}
		if err != nil {
			logf("reaping %s, left by process %d: %v", dir, pid, err)
		} else {
			logf("reaped %s, left by process %d", dir, pid)
		}
	}
}
