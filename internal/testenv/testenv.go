// Package testenv forwards to internal/testkit, where the CI rule and
// Eventually live; it remains for the relay/ tests that still import it.
package testenv

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// Unavailable is testkit.Unavailable.
func Unavailable(tb testing.TB, what, format string, args ...any) {
	tb.Helper()
	testkit.Unavailable(tb, what, format, args...)
}

// Eventually is testkit.Eventually.
func Eventually(tb testing.TB, timeout, interval time.Duration, cond func() (bool, string)) {
	tb.Helper()
	testkit.Eventually(tb, timeout, interval, cond)
}
