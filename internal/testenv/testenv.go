// Package testenv holds the two rules every test in this module follows
// about its surroundings: a test that cannot reach a service or tool it
// needs fails under CI=true (and skips, saying why, elsewhere), and a test
// waits for a condition by polling it against a deadline, never by a bare
// sleep.
package testenv

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// Unavailable fails tb under CI=true and skips it otherwise; what names
// the kind of thing missing ("service", "tool") and the format the reason.
func Unavailable(tb testing.TB, what, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		tb.Fatalf("required %s unavailable (CI=true): %s", what, msg)
	}
	tb.Skipf("skipping, %s unavailable (set CI=true to fail instead): %s", what, msg)
}

// Eventually polls cond every interval until it reports true, failing tb
// with cond's last explanation once timeout has passed.
func Eventually(tb testing.TB, timeout, interval time.Duration, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %s: %s", timeout, why)
		}
		time.Sleep(interval)
	}
}
