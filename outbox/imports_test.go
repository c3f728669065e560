package outbox_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// TestImportsOnlyPgxAndUUID keeps the package doc true: an application that
// writes messages pulls in pgx and google/uuid, not brokers, Prometheus or
// OpenTelemetry. Packages of pgx's own dependencies (golang.org/x/text,
// puddle, pgpassfile, pgservicefile) come with pgx.
func TestImportsOnlyPgxAndUUID(t *testing.T) {
	testkit.OnlyImports(t,
		"github.com/outbox-relay/outbox-relay/outbox",
		"github.com/outbox-relay/outbox-relay/internal/ident",
		"github.com/jackc/",
		"github.com/google/uuid",
		"golang.org/x/text/",
	)
}
