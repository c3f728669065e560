// Package testkit is the one kit the tests of this module share, kept apart
// from production packages:
//
//   - the CI rule: a test that cannot reach a service or tool it needs
//     fails under CI=true and skips elsewhere, saying why ([CI],
//     [Unavailable]);
//   - waiting on a condition instead of sleeping ([Eventually]);
//   - the shared services' URLs ([DatabaseURL], [AMQPURL], [NATSURL],
//     [RedisURL]), names of one's own on them ([RandName]) and logs into
//     the test's log ([Logger]);
//   - an HTTP receiver the HTTP sink posts to ([Receiver]);
//   - the outbox-relay binary run as a child process ([Relay]), used by the
//     chaos and fault suites and by bench.
//
// What lives elsewhere: throwaway servers (internal/testkit/pgtest,
// internal/testkit/amqptest, internal/testkit/throwaway), building the relay binary
// (internal/testkit/relaybin) and each suite's own checks.
package testkit
