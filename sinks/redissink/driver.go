package redissink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Redis Streams sink to programs that configure
// sinks by URL (see sinks.Driver). Redis has no CloudEvents binding: the
// cloudevents format writes the Kafka binding's ce_ fields.
var Driver = sinks.Driver{
	Schemes: []string{"redis", "rediss"},
	Section: "redis",
	Params:  params.Names(),
	Label:   "redis",
	System:  "redis",
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
