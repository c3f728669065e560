package httpsink

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the webhook sink to programs that configure sinks by
// URL (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"http", "https"},
	Section: "http",
	Params:  params.Names(),
	Label:   "http",
	System:  "webhook",
	Binding: "http",
	Parse:   sinks.Typed(ParseURL, sinks.WithLogger(New)),
}
