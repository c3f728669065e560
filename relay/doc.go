// Package relay runs outbox-relay's engine inside a Go program: it claims
// the messages applications committed to the outbox table, hands them to a
// sink, and deletes what the sink accepted, at least once and in order per
// key. The outbox-relay daemon is this package plus flags, metrics and an
// admin listener; embed it when the relay should live in your own process.
//
// What to call:
//
//   - NewPool opens the relay's database pool with the session settings it
//     relies on (timeouts, keepalives, synchronous_commit off for its own
//     sessions only). For one Relay, PoolConfig{Workers: cfg.Workers} sizes
//     it as the daemon does: a connection per batch in flight, the lane
//     lease, LISTEN and one for health checks. For several relays on one
//     pool, set MaxConns to Conns(cfgs...) + PipelineConns(cfgs...) + 1;
//     Conns(cfgs...) + 1 is the least that runs every worker, one batch at
//     a time.
//   - New(pool, sink, Config) builds one Relay for one sink; Run(ctx)
//     relays until ctx ends, then stops claiming, lets the batches in flight
//     finish (Config.DrainTimeout), hands its lanes to other relays and
//     returns.
//   - NewSet(pool, SetConfig) runs several routes in one process (topic
//     patterns, fan-out to several sinks, dead letters for unrouted
//     topics), as the daemon's routes table does; Set.Run as Relay.Run.
//   - Relay.Live and Relay.Ready (Set too) answer liveness and readiness
//     probes; Relay.Stats counts the relay's work.
//   - Config documents every setting with its default; Config.Validate
//     names the field at fault. Config.RetryPolicy replaces the default
//     retry schedule (ExponentialRetry) with one of your own.
//
// The schema must be migrated first (package migrations, or
// `outbox-relay migrate`). Metrics and tracing plug in through Config.Hooks
// (packages relayprom and relayotel); operator actions (status, dead-letter
// replay and purge, archive replay) are in package relay/operator; sinks
// are in package sinks and its subpackages. Messages are written by package
// outbox, in the application's own transaction.
//
// Guarantees: every committed message is handed to the sink at least once
// with a stable message id; messages of one key go in write order and never
// concurrently, across any number of relay processes; a failed delivery is
// retried with backoff stored in its row and holds back only its own key;
// after Config.MaxAttempts (or when the RetryPolicy gives up), or a
// permanent error, it moves to the
// dead-letter table. docs/guarantees.md names the test behind each promise.
package relay
