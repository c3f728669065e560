package amqpsink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the RabbitMQ sink to programs that configure sinks by
// URL (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"amqp", "amqps"},
	Section: "amqp",
	Params:  params.Names(),
	Label:   "amqp",
	System:  "rabbitmq",
	Binding: "amqp",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
