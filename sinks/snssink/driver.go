package snssink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Amazon SNS sink to programs that configure sinks
// by URL (see sinks.Driver). SNS has no CloudEvents binding: the
// cloudevents format writes the Kafka binding's ce_ headers, which become
// message attributes.
var Driver = sinks.Driver{
	Schemes: []string{"sns"},
	Section: "sns",
	Params:  params.Names(),
	Label:   "sns",
	System:  "aws_sns",
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
