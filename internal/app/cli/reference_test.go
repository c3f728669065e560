package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
)

// The committed reference is what the commands say now: a flag, a default,
// a help text or a sink parameter that changed without
// `go run ./internal/app/cli/gendoc` fails here.
func TestReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	committed, err := os.ReadFile(filepath.Join("..", "..", "..", cli.ReferencePath))
	require.NoError(t, err)
	require.Equal(t, string(cli.Reference()), string(committed),
		"%s differs from the commands: run `go run ./internal/app/cli/gendoc` (or `make docs`) from the repository's root and commit it", cli.ReferencePath)
}

// Every URL parameter a sink takes is documented on its page of
// docs/sinks (the page the reference links for it).
func TestSinkPagesNameEveryParameter(t *testing.T) {
	t.Parallel()
	for page, params := range cli.SinkPages() {
		doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", page))
		require.NoError(t, err)
		for _, p := range params {
			require.Contains(t, string(doc), "`"+p+"`", "docs/%s does not document the URL parameter %s", page, p)
		}
	}
}
