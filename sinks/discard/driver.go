package discard

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the discard sink to programs that configure sinks by
// URL (see sinks.Driver).
var Driver = sinks.Driver{
	Schemes: []string{"discard"},
	Label:   "discard",
	Parse:   sinks.Typed(ParseURL, sinks.WithLogger(New)),
}
