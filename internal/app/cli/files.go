package cli

import (
	"fmt"
	"io"
	"io/fs"
)

// Limits on the files the command line reads. A secret or a token list
// is a line or a few; a config file a few pages. Anything larger is a
// mistake (a log, a device such as /dev/zero) that would otherwise be
// read into memory whole.
const (
	maxSecretFileBytes = 64 << 10
	maxConfigFileBytes = 1 << 20
)

// readRegularFile reads path for the option named what: only a regular
// file (a FIFO, a device, a directory or a socket is refused by what it
// is), of at most limit bytes. It opens without blocking, so that a FIFO
// nobody writes to cannot hold the start-up (and the SIGTERM that should
// end it), and checks the kind on the opened file, so that the path
// cannot be swapped between a check and the read. Errors name what and
// the path, never the content.
func readRegularFile(what, path string, limit int64) ([]byte, fs.FileInfo, error) {
	f, err := openNonBlocking(path)
	if err != nil {
		return nil, nil, usagef("outbox: %s: %v", what, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, usagef("outbox: %s: %v", what, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, usagef("outbox: %s: %s is %s, not a regular file", what, path, fileKind(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, nil, usagef("outbox: %s: read %s: %v", what, path, err)
	}
	if int64(len(b)) > limit {
		return nil, nil, usagef("outbox: %s: %s is larger than %d bytes", what, path, limit)
	}
	return b, fi, nil
}

// fileKind names a file type that is not a regular file.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return fmt.Sprintf("of type %v", m.Type())
}
