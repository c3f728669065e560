package chaos

import "syscall"

// sysProcAttr makes the kernel kill a relay when the test process dies
// (a test timeout panics without running cleanups), so no relay outlives
// its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
