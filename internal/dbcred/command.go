package dbcred

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
	"unicode"
)

const (
	// CommandReuse is how long Command reuses a password its command
	// printed: long enough that a pool opening its connections at once
	// (7 by default, after a restart of the server or a rotation that
	// ended the sessions) runs the command once, short enough that a
	// rotated password is taken within seconds.
	CommandReuse = 10 * time.Second
	// CommandTimeout is the longest Command waits for its command (and
	// less when the connection attempt's own deadline comes first).
	CommandTimeout = 30 * time.Second
	// maxCommandStderr bounds the command's stderr quoted in an error.
	maxCommandStderr = 1 << 10
)

// Command gives what the shell command line prints on stdout, without its
// trailing newline: `vault read -field=password database/static-creds/relay`,
// `gcloud sql generate-login-token`, a script of one's own. It runs with
// /bin/sh -c, the relay's environment and no stdin, when a new connection
// needs a password and the last one is older than CommandReuse, for at
// most CommandTimeout. It must exit 0 and print one non-empty line.
// Errors carry its exit status and stderr (the first KiB), never its
// stdout.
func Command(line string) *Source {
	return newSource(func(ctx context.Context, now time.Time) (string, time.Time, error) {
		pw, err := runCommand(ctx, line)
		return pw, now.Add(CommandReuse), err
	})
}

// runCommand runs line once and returns the password it printed.
func runCommand(parent context.Context, line string) (string, error) {
	ctx, cancel := context.WithTimeout(parent, CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", line)
	stdout, stderr := &capped{max: maxFileBytes}, &capped{max: maxCommandStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A child that outlives the shell and keeps its output open must not
	// hold the connection once the shell has exited or been killed.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case parent.Err() != nil:
		// The connection attempt gave up first.
		return "", fmt.Errorf("database-password-command: stopped: %w%s", context.Cause(parent), quoteStderr(stderr))
	case ctx.Err() != nil:
		return "", fmt.Errorf("database-password-command: no password within %s%s", CommandTimeout, quoteStderr(stderr))
	}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return "", fmt.Errorf("database-password-command: %w", err)
		}
		return "", fmt.Errorf("database-password-command: %s%s", ee.ProcessState, quoteStderr(stderr))
	}
	if stdout.over {
		return "", fmt.Errorf("database-password-command: the output is larger than %d bytes; it must be the password alone", maxFileBytes)
	}
	return oneLine("database-password-command: the output", stdout.String())
}

// capped keeps the first max bytes written to it and drops the rest, so
// that a command that prints without end costs no more memory. (Not an
// embedded bytes.Buffer: io.Copy would use its ReadFrom, past Write.)
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		c.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *capped) String() string { return c.buf.String() }

// quoteStderr is " (stderr: ...)" with what the command wrote on stderr
// (its first KiB), trimmed, control characters replaced; "" when it wrote
// nothing.
func quoteStderr(stderr *capped) string {
	s := strings.TrimSpace(stderr.String())
	if s == "" {
		return ""
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if stderr.over {
		s += "…"
	}
	return " (stderr: " + s + ")"
}
