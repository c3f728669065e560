package inbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyPgx keeps the package doc true: a consumer that imports
// the inbox pulls in pgx, not the relay, the sinks or a broker client.
func TestImportsOnlyPgx(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := []string{
		"github.com/outbox-relay/outbox-relay/inbox",
		"github.com/outbox-relay/outbox-relay/internal/ident",
		"github.com/outbox-relay/outbox-relay/internal/sqlmigrate",
		"github.com/jackc/",
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
			t.Errorf("package inbox imports %s (directly or through another package)", p)
		}
	}
}
