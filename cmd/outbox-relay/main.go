// Command outbox-relay publishes Postgres outbox rows to message sinks.
// See `outbox-relay --help`; the implementation lives in internal/cli.
package main

import (
	"os"

	"github.com/outbox-relay/outbox-relay/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
