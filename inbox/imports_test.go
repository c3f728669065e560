package inbox_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// TestImportsOnlyPgx keeps the package doc true: a consumer that imports
// the inbox pulls in pgx, not the relay, the sinks or a broker client
// (sinks/wire, the names the sinks write and the adapters read, is
// constants only and imports nothing).
func TestImportsOnlyPgx(t *testing.T) {
	t.Parallel()
	testkit.OnlyImports(t,
		"github.com/outbox-relay/outbox-relay/inbox",
		"github.com/outbox-relay/outbox-relay/internal/ident",
		"github.com/outbox-relay/outbox-relay/internal/sqlmigrate",
		"github.com/outbox-relay/outbox-relay/sinks/wire",
		"github.com/jackc/",
		"golang.org/x/text/",
	)
}
