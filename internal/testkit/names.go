package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// RandName returns prefix followed by 12 random hex digits: a name of the
// test's own on a shared service (a queue, a stream, a key prefix).
func RandName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Logger returns a text logger at level whose lines go to tb.Log, so that
// they are shown with the test that wrote them.
func Logger(tb testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(tb), &slog.HandlerOptions{Level: level}))
}

// LogWriter is an io.Writer whose every Write is one tb.Log line.
func LogWriter(tb testing.TB) io.Writer { return logWriter{tb} }

type logWriter struct{ tb testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
