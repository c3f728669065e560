// Package builtin is the list of the sinks this project ships, as a
// sinks.Registry: the one place a program (the outbox-relay CLI, the
// benchmarks) learns which sink URL schemes exist. It holds no sink code.
//
// # Adding a sink
//
// A new sink (say NATS JetStream, nats://) lives in its own package,
// sinks/natssink, which
//
//   - implements sinks.Sink (and sinks.HealthChecker if it can tell
//     whether its backend is up) and passes sinks/sinktest;
//   - has a Config with ParseURL (every URL parameter in one
//     sinkconf.Params table, which also renders Redacted, so an unknown
//     parameter is an error naming it and no secret is ever printed),
//     Validate, Redacted and New, and a decodeURL that reads the URL
//     without validating it (sinkconf.DecodeURL), since the config
//     file's section may complete it;
//   - marks the parameters that decide where a message goes or the form
//     it arrives in with sinkconf.Routing, and names its destination with
//     Target (sinks.Targeter), so that relays of one route that deliver
//     to different places are told apart and tuning is not;
//   - exports a Driver: its schemes, config-file section, metrics label,
//     messaging system, CloudEvents binding and sinks.Typed(decodeURL, New).
//
// Then add natssink.Driver to the list below: that line is all the CLI,
// its routes, the formats and the metrics need. TestDrivers checks the
// new driver's parameters round-trip and redact.
package builtin

import (
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
	"github.com/outbox-relay/outbox-relay/sinks/discard"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
	"github.com/outbox-relay/outbox-relay/sinks/kinesissink"
	"github.com/outbox-relay/outbox-relay/sinks/mqttsink"
	"github.com/outbox-relay/outbox-relay/sinks/natssink"
	"github.com/outbox-relay/outbox-relay/sinks/pubsubsink"
	"github.com/outbox-relay/outbox-relay/sinks/redissink"
	"github.com/outbox-relay/outbox-relay/sinks/snssink"
	"github.com/outbox-relay/outbox-relay/sinks/sqssink"
	"github.com/outbox-relay/outbox-relay/sinks/stdout"
)

// Registry holds every sink this project ships, in the order the CLI's
// help lists them.
var Registry = sinks.NewRegistry(
	stdout.Driver,
	discard.Driver,
	kafkasink.Driver,
	amqpsink.Driver,
	httpsink.Driver,
	natssink.Driver,
	redissink.Driver,
	sqssink.Driver,
	snssink.Driver,
	kinesissink.Driver,
	pubsubsink.Driver,
	mqttsink.Driver,
)
