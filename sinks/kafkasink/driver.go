package kafkasink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Kafka sink to programs that configure sinks by URL
// (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"kafka"},
	Section: "kafka",
	Params:  params.Names(),
	Label:   "kafka",
	System:  "kafka",
	Binding: "kafka",
	Parse:   sinks.Typed(ParseURL, sinks.WithLogger(New)),
}
