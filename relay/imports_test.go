package relay_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// TestEngineImportsTheGroundFloor: the engine and the operator actions
// read the outbox, they do not write it (the errors they share with the
// writer live in internal/ident, re-exported by migrations and outbox),
// and the metrics read what the engine exposes (operator.Admin.Gauges,
// as status does), not the store underneath.
func TestEngineImportsTheGroundFloor(t *testing.T) {
	t.Parallel()
	const writer, store = "github.com/outbox-relay/outbox-relay/outbox", "github.com/outbox-relay/outbox-relay/internal/store"
	require.NotContains(t, testkit.Imports(t, ".", true), writer, "relay")
	require.NotContains(t, testkit.Imports(t, "./operator", true), writer, "relay/operator")
	require.NotContains(t, testkit.Imports(t, "./relayprom", false), store, "relay/relayprom")
}
