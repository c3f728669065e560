// Package chaos holds the end-to-end chaos and scale-out tests of
// outbox-relay. They build the real outbox-relay binary, run several relay
// processes against one database (or one relay against 50 databases,
// TestChaosManyDatabases) and a real HTTP webhook receiver, and
// break things while applications write: relays are SIGKILLed, paused and
// restarted, their database sessions are terminated, the receiver fails,
// and in the long form (CHAOS_LONG=1, `make chaos`) PostgreSQL itself is
// restarted (a throwaway server of the test's own, from pgtest.Server: the
// shared one is never restarted). The tests then check the delivery contract from the
// consumer's side: every committed message arrives, no rolled-back one
// does, per-key order holds and duplicates carry the message's stable id.
//
// The package has no code outside its tests; docs/chaos.md describes what
// the tests do, how to run them and the figures measured.
package chaos
