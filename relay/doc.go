// Package relay is the engine of outbox-relay: workers claim committed
// outbox rows, hand them to a sink, and delete what the sink accepted, in
// one transaction per batch ("lock while publishing").
//
// Ordering. Every message belongs to one of 256 lanes (a hash of its key).
// Relay processes lease lanes through the lanes table, each taking a fair
// share, and rebalance at once when one joins or leaves (it says so with a
// NOTIFY from its own session, see lease.go); a lane is worked on by one
// worker of one process at a time, and in id order. Messages with the same key therefore reach the sink in the
// order they were written, never concurrently, whatever the number of
// relay processes. A message whose delivery failed waits for its retry in
// the row (attempts, available_at) and holds back the later messages of its
// key, and only of its key.
//
// Failure. A relay that dies mid-batch loses nothing: its transaction
// aborts and the rows are claimable again. Its lanes go to other relays
// when its lease connection is seen closed, or at the latest after LeaseTTL.
// Idle-in-transaction and statement timeouts on the relay's sessions bound
// how long a relay cut off from the database can hold rows.
//
// Routes. A Relay serves one route; a Set runs several in one process
// (relay.NewSet), with the fan-out router, the unrouted route and one
// shared LISTEN, as the CLI's routes table does (set.go). Topic patterns
// are package topic's.
//
// Where things are. The worker loop (worker.go) claims from a source
// chosen once by New (claim.go: the outbox, a route's fan-out copies, or
// the outbox for the fan-out router), hands the batch to the sink and
// settles it. The retry and dead-letter rule is the settle decision
// (settle.go: an outcome becomes a delete, a retry or a dead letter; the
// delay comes from retry.go); apart.go settles row by row when the
// database refuses a batch's statements. Lane leases are in lease.go,
// Live and Ready in health.go. Wake-up is in wake.go (the LISTEN session
// and the watcher elected per schema, which polls or follows the WAL,
// wal.go, and names the lanes that got rows, lanes.go): nothing runs in
// the writers' transactions by default. This package holds no
// SQL: every statement it runs (the claim query among them) is a typed
// method of package internal/store, rendered once per schema and source.
//
// This package does not parse flags or know any concrete sink.
package relay
