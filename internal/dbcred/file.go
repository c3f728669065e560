package dbcred

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
)

// maxFileBytes bounds what File reads: a password is a line, and
// anything larger is a mistake (a log, a device) not to read whole.
const maxFileBytes = 64 << 10

// File gives the content of the file at path, read again for every new
// connection (a Vault agent or a secret manager's CSI driver rewrites it
// when the password rotates), without its trailing newline. The file is a
// regular file of one line (a FIFO, a device or a directory is refused
// without blocking), of at most 64 KiB, and not empty.
func File(path string) *Source {
	return newSource(func(context.Context, time.Time) (string, time.Time, error) {
		pw, err := ReadFile(path)
		return pw, time.Time{}, err
	})
}

// ReadFile reads a password file as File does, once. Its errors start
// with the option's name, database-password-file, and never quote the
// content.
func ReadFile(path string) (string, error) {
	f, err := openNonBlocking(path)
	if err != nil {
		return "", fmt.Errorf("database-password-file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("database-password-file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("database-password-file: %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("database-password-file: read %s: %w", path, err)
	}
	if len(b) > maxFileBytes {
		return "", fmt.Errorf("database-password-file: %s is larger than %d bytes; the file holds the password alone", path, maxFileBytes)
	}
	return oneLine("database-password-file: "+path, string(b))
}

// oneLine returns s without its trailing newlines, refusing an empty
// value and one of several lines or with control characters; errors
// start with what and never quote s.
func oneLine(what, s string) (string, error) {
	pw := strings.TrimRight(s, "\r\n")
	switch {
	case pw == "":
		return "", errors.New(what + " is empty")
	case strings.ContainsFunc(pw, unicode.IsControl):
		return "", errors.New(what + " holds more than one line or control characters; it must hold the password alone")
	}
	return pw, nil
}
