package schemacheck

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// A relay runs on the schema version it knows and on newer ones whose
// migrations it can still run beside; it says what to do otherwise.
func TestRunsOn(t *testing.T) {
	t.Parallel()
	known := migrations.Latest()
	if err := RunsOn("outbox", known, known); err != nil {
		t.Fatalf("the version it knows: %v", err)
	}
	if err := RunsOn("outbox", known+1, known); err != nil {
		t.Fatalf("a newer schema that still runs this relay: %v", err)
	}
	for _, c := range []struct {
		version, relayMin int
		says              string
		missing           bool
	}{
		{0, 0, "run `outbox-relay migrate`", true},
		{known - 1, 0, "run `outbox-relay migrate`", false},
		{known + 1, known + 1, "upgrade the relay", false},
	} {
		err := RunsOn("outbox", c.version, c.relayMin)
		if err == nil || !strings.Contains(err.Error(), c.says) || errors.Is(err, migrations.ErrSchemaMissing) != c.missing {
			t.Errorf("version %d, relays from %d: %v; want an error saying %q (schema missing: %v)", c.version, c.relayMin, err, c.says, c.missing)
		}
	}
}

func TestNewNeedsItsInputs(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil {
		t.Fatal("a watcher without a pool, a logger or a callback was built")
	}
}
