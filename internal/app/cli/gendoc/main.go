// Command gendoc writes the command-line and configuration reference,
// docs/cli.md, from the commands themselves. Run it from the repository's
// root after changing a command, a flag or a sink's parameters:
//
//	go run ./internal/app/cli/gendoc   (or: make docs)
//
// internal/app/cli's TestReferenceIsCurrent fails until the file is rewritten.
package main

import (
	"fmt"
	"os"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
)

func main() {
	if err := os.WriteFile(cli.ReferencePath, cli.Reference(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
