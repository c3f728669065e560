package natssink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the NATS JetStream sink to programs that configure
// sinks by URL (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"nats"},
	Section: "nats",
	Params:  params.Names(),
	Label:   "nats",
	System:  "nats",
	Binding: "nats",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
