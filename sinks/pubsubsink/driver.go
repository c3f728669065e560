package pubsubsink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the Google Cloud Pub/Sub sink to programs that
// configure sinks by URL (see sinks.Driver). The cloudevents format
// writes the Kafka binding's ce_ headers, which become attributes (the
// Pub/Sub binding's ce- attribute names differ only in the separator).
var Driver = sinks.Driver{
	Schemes: []string{"pubsub"},
	Section: "pubsub",
	Params:  params.Names(),
	Label:   "pubsub",
	System:  "gcp_pubsub",
	Binding: "",
	Parse:   sinks.Typed(decodeURL, sinks.WithLogger(New)),
}
