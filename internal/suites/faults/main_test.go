package faults

import (
	"os"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
)

func TestMain(m *testing.M) { relaybin.Main(m) }

// long reports whether the long forms were asked for (FAULTS_LONG=1).
func long() bool { return os.Getenv("FAULTS_LONG") == "1" }

// relayBinary is the relay under test, built once per run without -race:
// the relay is the system under test, the race detector watches this
// process.
func relayBinary(t testing.TB) string { return relaybin.Binary(t) }
