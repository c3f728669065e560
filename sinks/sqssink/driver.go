package sqssink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Amazon SQS sink to programs that configure sinks
// by URL (see sinks.Driver). SQS has no CloudEvents binding: the
// cloudevents format writes the Kafka binding's ce_ headers, which become
// message attributes.
var Driver = sinks.Driver{
	Schemes: []string{"sqs"},
	Section: "sqs",
	Params:  params.Names(),
	Label:   "sqs",
	System:  "aws_sqs",
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
