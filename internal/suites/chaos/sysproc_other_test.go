//go:build !linux

package chaos

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
