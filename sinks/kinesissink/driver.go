package kinesissink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Amazon Kinesis Data Streams sink to programs that
// configure sinks by URL (see sinks.Driver). Kinesis has no CloudEvents
// binding, and a record no attributes: the cloudevents format writes the
// Kafka binding's ce_ headers, which travel only with record_format=json.
var Driver = sinks.Driver{
	Schemes: []string{"kinesis"},
	Section: "kinesis",
	Params:  params.Names(),
	Label:   "kinesis",
	System:  "aws_kinesis",
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
