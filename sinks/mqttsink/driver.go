package mqttsink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the MQTT 5 sink to programs that configure sinks by
// URL (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"mqtt", "mqtts"},
	Section: "mqtt",
	Params:  params.Names(),
	Label:   "mqtt",
	System:  "mqtt",
	// The CloudEvents format uses the Kafka binding's names (ce_
	// user properties, content-type): see docs/sinks/mqtt.md.
	Binding: "kafka",
	Parse:   sinks.Typed(ParseURL, sinks.WithLogger(New)),
}
