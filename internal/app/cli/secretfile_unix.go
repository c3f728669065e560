//go:build unix

package cli

import (
	"io/fs"
	"os"
	"slices"
	"syscall"
)

// groupIsOurs reports whether fi's group is one this process belongs to:
// then a group-readable secret file is how the relay is meant to read it
// (Kubernetes mounts secrets as root:fsGroup, so 0440 is the tightest mode
// a non-root relay can read).
func groupIsOurs(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	if int(st.Gid) == os.Getegid() {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, int(st.Gid))
}

// openNonBlocking opens path for reading without waiting for a writer
// (a FIFO's open blocks until one comes). O_NONBLOCK changes nothing for a
// regular file.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
