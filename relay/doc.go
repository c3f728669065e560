// Package relay runs outbox-relay's engine inside a Go program: it claims
// the messages applications committed to the outbox table (package
// outbox), hands them to a sink (package sinks), and deletes what the
// sink accepted, at least once and in order per key across any number of
// relay processes. The outbox-relay daemon is this package plus flags,
// metrics and an admin listener.
//
// NewPool opens the database pool with the session settings the relay
// relies on; New builds a Relay for one sink, and Relay.Run relays until
// its context ends, then drains. NewSet runs several routes (topic
// patterns, fan-out, dead letters for unrouted topics) in one process, as
// the daemon's routes table does. Live and Ready answer health probes;
// Config documents every setting and its default, and Config.Validate
// names the field at fault. Hooks observe a relay (packages relayprom and
// relayotel); RetryPolicy replaces the retry schedule; package
// relay/operator holds the operator's actions (status, dead letters,
// replays).
//
// The schema must be migrated first (package migrations, or
// `outbox-relay migrate`). docs/operations.md, "Embedding the relay in a
// Go program", is the guide to this package; docs/guarantees.md states
// the guarantees and names the test behind each.
package relay
