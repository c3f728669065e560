//go:build unix

package dbcred

import (
	"os"
	"syscall"
)

// openNonBlocking opens path for reading without waiting for a writer (a
// FIFO's open blocks until one comes, and would hold the connection).
// O_NONBLOCK changes nothing for a regular file.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
