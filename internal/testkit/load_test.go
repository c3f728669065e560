package testkit

import (
	"testing"
	"time"
)

// TestLoadScaledNeverShortens: a bound stretched by the load is never
// shorter than the bound itself, and an idle reading keeps it.
func TestLoadScaledNeverShortens(t *testing.T) {
	if got := LoadScaled(time.Second); got < time.Second {
		t.Fatalf("LoadScaled(1s) = %s, want at least 1s", got)
	}
	if got := LoadScaled(0); got != 0 {
		t.Fatalf("LoadScaled(0) = %s, want 0", got)
	}
}
