package testkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RelayConfig says how to start one outbox-relay process.
type RelayConfig struct {
	// Bin is the path of the outbox-relay binary (internal/testkit/relaybin builds
	// one for tests).
	Bin string
	// Args is the command line after the binary's name, "run" first.
	Args []string
	// Env is the process's whole environment; nil means CleanEnv().
	Env []string
	// Stdout and Stderr receive the process's output; nil discards it.
	Stdout, Stderr io.Writer
	// SysProcAttr, when set, is the process's (a process group of its own,
	// a parent-death signal).
	SysProcAttr *syscall.SysProcAttr
	// StopTimeout is how long Stop, and the end of the context given to
	// StartRelay, wait after SIGTERM before SIGKILL. Zero means 30s.
	StopTimeout time.Duration
}

// Relay is one outbox-relay process started by StartRelay.
type Relay struct {
	cmd         *exec.Cmd
	stopTimeout time.Duration
	started     time.Time
	spoke       chan struct{}
	spokeOnce   sync.Once
	done        chan struct{}

	// Set before done is closed.
	exited time.Time
	err    error
}

// StartRelay starts the process. When ctx ends the process gets SIGTERM,
// and SIGKILL cfg.StopTimeout later if it is still running.
func StartRelay(ctx context.Context, cfg RelayConfig) (*Relay, error) {
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	r := &Relay{stopTimeout: cfg.StopTimeout, spoke: make(chan struct{}), done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, cfg.Bin, cfg.Args...)
	cmd.Env = cfg.Env
	if cmd.Env == nil {
		cmd.Env = CleanEnv()
	}
	// A file stays a file: the relay writes to it directly, never held
	// up by a copying goroutine in a busy test process.
	cmd.Stdout = cfg.Stdout
	f, isFile := cfg.Stderr.(*os.File)
	var size0 int64
	if isFile {
		cmd.Stderr = f
		if fi, err := f.Stat(); err == nil {
			size0 = fi.Size()
		}
	} else {
		cmd.Stderr = r.announcing(cfg.Stderr)
	}
	cmd.SysProcAttr = cfg.SysProcAttr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = cfg.StopTimeout
	r.cmd = cmd
	r.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		r.exited, r.err = time.Now(), err
		close(r.done)
	}()
	if isFile {
		go r.watchFile(f, size0)
	}
	return r, nil
}

// CleanEnv is this process's environment without OUTBOX_* and
// DATABASE_URL*, which would configure a relay behind the test's back.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OUTBOX_") || strings.HasPrefix(kv, "DATABASE_URL") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// watchFile closes r.spoke once the file f, the process's stderr, grows
// past size0, checking every 10ms until the process exits.
func (r *Relay) watchFile(f *os.File, size0 int64) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if fi, err := f.Stat(); err == nil && fi.Size() > size0 {
			r.spokeOnce.Do(func() { close(r.spoke) })
			return
		}
		select {
		case <-r.done:
			return
		case <-t.C:
		}
	}
}

// announcing wraps w so that the first byte written closes r.spoke.
func (r *Relay) announcing(w io.Writer) io.Writer {
	if w == nil {
		w = io.Discard
	}
	return writerFunc(func(p []byte) (int, error) {
		if len(p) > 0 {
			r.spokeOnce.Do(func() { close(r.spoke) })
		}
		return w.Write(p)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Pid is the process id.
func (r *Relay) Pid() int { return r.cmd.Process.Pid }

// Started is when the process was started.
func (r *Relay) Started() time.Time { return r.started }

// Spoke is closed at the process's first output on stderr, where it logs
// (a line on stdout, from the stdout sink, does not count unless stdout
// is the same file as stderr). cmd/outbox-relay
// installs its SIGTERM handler before anything else, so from then on a
// SIGTERM stops the relay cleanly instead of killing it.
func (r *Relay) Spoke() <-chan struct{} { return r.spoke }

// Done is closed once the process has exited and its output is copied.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Alive reports whether the process has not exited yet.
func (r *Relay) Alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Exited is when the process exited; valid once Done is closed.
func (r *Relay) Exited() time.Time { return r.exited }

// Err is what waiting for the process returned (nil: exit status 0);
// valid once Done is closed.
func (r *Relay) Err() error { return r.err }

// ExitCode is the exit status, -1 when a signal ended the process or it
// is still running.
func (r *Relay) ExitCode() int { return r.State().ExitCode() }

// State is the exited process's state, nil while it is running.
func (r *Relay) State() *os.ProcessState {
	if r.Alive() {
		return nil
	}
	return r.cmd.ProcessState
}

// Signal sends sig to the process.
func (r *Relay) Signal(sig os.Signal) error { return r.cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit by itself and reports
// whether it did.
func (r *Relay) Wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		return true
	case <-t.C:
		return false
	}
}

// ErrKilled says a relay did not exit within its stop timeout of SIGTERM
// and was killed.
var ErrKilled = errors.New("relay did not exit after SIGTERM; killed")

// Stop sends SIGTERM and waits for the exit, SIGKILL after the stop
// timeout (ErrKilled). It returns nil at once when the process has exited
// already; call it as often as you like.
func (r *Relay) Stop() error {
	if !r.Alive() {
		return nil
	}
	_ = r.Signal(syscall.SIGTERM)
	if r.Wait(r.stopTimeout) {
		return nil
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	return fmt.Errorf("%w (pid %d, %s)", ErrKilled, r.Pid(), r.stopTimeout)
}

// Memory returns the running process's resident set (VmRSS) and its peak
// (VmHWM), in bytes, from /proc (Linux only).
func (r *Relay) Memory() (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.Pid()))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			hwm = v * 1024
		}
	}
	if rss == 0 {
		return 0, 0, errors.New("no VmRSS (process gone?)")
	}
	return rss, hwm, nil
}

// CPUTime is the CPU time (user + system) the process has used so far,
// from /proc (Linux only).
func (r *Relay) CPUTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.Pid()))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc stat: %q", s)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck, nil
}
