//go:build !unix

package dbcred

import "os"

// openNonBlocking opens path for reading (this system has no FIFO that
// blocks an open).
func openNonBlocking(path string) (*os.File, error) { return os.Open(path) }
