// Command outbox-relay publishes Postgres outbox rows to message sinks.
// See `outbox-relay --help`; the implementation lives in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-relay/outbox-relay/internal/cli"
)

func main() {
	// Caught before anything else: a SIGTERM that arrives while the relay
	// is still starting stops it cleanly instead of killing it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	cli.TuneGC()
	code := cli.MainContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
