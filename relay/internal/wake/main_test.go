package wake

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that Stop leaves nothing of a Waker running: its
// session, its WAL follower.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
