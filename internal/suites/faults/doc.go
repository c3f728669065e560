// Package faults holds the fault-injection tests of outbox-relay: each test
// breaks one thing on purpose (the relay's database sessions, the sink, the
// database itself, the input) against real services and checks the
// delivery contract from the consumer's side: nothing committed is lost,
// nothing is dead-lettered that should not be, everything arrives once the
// fault is gone, plus the behaviour specific to the fault.
//
// The package has no code outside its tests. Every test runs in the default
// `make test`; the long forms run with FAULTS_LONG=1. Tests that restart,
// stop or fill a server (TestPostgresRestart, TestAMQPOutage, the long
// write-load test) do it to a throwaway server of their own
// (pgtest.Server, amqptest.Server), never to the shared services.
// docs/guarantees.md lists the faults, what the relay does and the figures
// measured here.
package faults
