package testkit

import (
	"testing"
	"time"
)

// recorder is a testing.TB that records how a helper ended the test.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r)
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = format
	panic(r)
}

func run(r *recorder, f func()) {
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
	}()
	f()
}

func TestUnavailableFailsUnderCI(t *testing.T) {
	t.Setenv("CI", "true")
	r := &recorder{TB: t}
	run(r, func() { Unavailable(r, "service", "postgres at %s", "x") })
	if r.failed == "" || r.skipped != "" {
		t.Fatalf("under CI=true: failed %q, skipped %q", r.failed, r.skipped)
	}
	t.Setenv("CI", "")
	r = &recorder{TB: t}
	run(r, func() { Unavailable(r, "service", "postgres at %s", "x") })
	if r.skipped == "" || r.failed != "" {
		t.Fatalf("without CI: failed %q, skipped %q", r.failed, r.skipped)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, time.Millisecond, func() (bool, string) { n++; return n == 3, "counting" })
	if n != 3 {
		t.Fatalf("cond ran %d times, want 3", n)
	}
	r := &recorder{TB: t}
	run(r, func() {
		Eventually(r, 20*time.Millisecond, time.Millisecond, func() (bool, string) { return false, "never" })
	})
	if r.failed == "" {
		t.Fatal("a condition that never holds did not fail the test")
	}
}
