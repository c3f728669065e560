package chaos

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
)

func TestMain(m *testing.M) { relaybin.Main(m) }

// relayBinary is the relay under test, built once per run without -race:
// the relays are the system under test, the race detector watches the
// test process.
func relayBinary(t testing.TB) string { return relaybin.Binary(t) }
