package relay

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/internal/wake"
)

// listen hands Config.Wakeup to the wake-up as it is: both packages must
// spell the modes alike.
func TestWakeupModesAreTheWakeUpsModes(t *testing.T) {
	t.Parallel()
	for _, m := range [][2]string{
		{WakeupAuto, wake.ModeAuto}, {WakeupWAL, wake.ModeWAL}, {WakeupPoll, wake.ModePoll}, {WakeupNotify, wake.ModeNotify},
	} {
		if m[0] != m[1] {
			t.Errorf("relay.Wakeup %q is wake's %q", m[0], m[1])
		}
	}
}
