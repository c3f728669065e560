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
	// CloudEvents has an MQTT binding, but the format package does not
	// implement it: programs fall back to the Kafka binding's names (ce_
	// user properties, content-type), see docs/sinks/mqtt.md.
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
