// Command outbox-relay publishes Postgres outbox rows to message sinks.
// See `outbox-relay --help`; the implementation lives in internal/app/cli.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
)

func main() {
	// Caught before anything else: a SIGTERM that arrives while the relay
	// is still starting stops it cleanly instead of killing it.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		<-signals
		stop() // the first signal: a graceful stop, bounded by the drain timeout
		sig := <-signals
		// The second: the operator wants out now. Nothing is lost by
		// exiting here: a claim not yet committed rolls back when its
		// connection closes, and what a sink may already have accepted is
		// delivered again with the same message id.
		fmt.Fprintf(os.Stderr, "outbox-relay: second %s: exiting at once; uncommitted claims roll back and their messages stay in the outbox\n", sig)
		os.Exit(1)
	}()
	cli.TuneGC()
	code := cli.MainContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
