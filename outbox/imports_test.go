package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyPgxAndUUID keeps the package doc true: an application that
// writes messages pulls in pgx and google/uuid, not brokers, Prometheus or
// OpenTelemetry. Packages of pgx's own dependencies (golang.org/x/text,
// puddle, pgpassfile, pgservicefile) come with pgx.
func TestImportsOnlyPgxAndUUID(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := []string{
		"github.com/outbox-relay/outbox-relay/outbox",
		"github.com/outbox-relay/outbox-relay/internal/ident",
		"github.com/jackc/",
		"github.com/google/uuid",
		"golang.org/x/text/",
	}
	for _, p := range strings.Fields(string(out)) {
		ok := false
		for _, a := range allowed {
			if p == a || strings.HasPrefix(p, a) {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("package outbox imports %s (directly or through another package)", p)
		}
	}
}
