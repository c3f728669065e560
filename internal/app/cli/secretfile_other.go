//go:build !unix

package cli

import (
	"io/fs"
	"os"
)

// groupIsOurs cannot tell on this system; a group-readable file is
// reported.
func groupIsOurs(fs.FileInfo) bool { return false }

// openNonBlocking opens path for reading (this system has no FIFO that
// blocks an open).
func openNonBlocking(path string) (*os.File, error) { return os.Open(path) }
