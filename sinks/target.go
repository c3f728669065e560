package sinks

// Targeter is implemented by a sink that can name its destination's
// identity: what decides where its messages go and the form they arrive
// in (a webhook's URL and topic routes, an exchange and routing key, a
// stream, a topic map, a content type), without tuning (timeouts,
// concurrency, batching, rates, reconnects) or credentials. Relays of one
// route compare targets, through a hash, to find relays that would
// deliver its messages elsewhere; two sinks of one kind that deliver to
// the same place return the same target whatever their tuning.
//
// A target is not for logs: a webhook's path may hold its token. The
// built-in sinks build theirs with sinkconf.Params.Target.
type Targeter interface {
	Target() string
}
