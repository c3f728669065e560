// Package testproc runs throwaway server processes for tests (a PostgreSQL
// server in internal/testkit/pgtest, a RabbitMQ node in internal/testkit/amqptest): a
// private directory per instance, a free loopback port, and a cleanup that
// kills every process of the instance and removes its directory, also when
// the test fails or panics. Instances left behind by a test binary that
// died before its cleanups ran (a -timeout panic, SIGKILL) are reaped by
// the next New.
//
// What lives elsewhere: how to start a particular server, and the shared
// services the rest of the suite uses (they are only read and written,
// never started, stopped or reconfigured by a test).
//
// Linux only: the processes of an instance are found through /proc.
package testproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// ErrUnsupported is returned by New where throwaway servers are not
// supported (outside Linux).
var ErrUnsupported = errors.New("throwaway servers are supported on Linux only")

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Tail returns the last n lines of the file at path, for failure messages.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
