package stdout

import "github.com/outbox-relay/outbox-relay/sinks"

// Driver describes the stdout sink to programs that configure sinks by URL
// (see sinks.Driver). It writes to the Env's Stdout.
var Driver = sinks.Driver{
	Schemes: []string{"stdout"},
	Label:   "stdout",
	Parse: sinks.Typed(ParseURL, func(c Config, env sinks.Env) (*Sink, error) {
		c.Output = env.Stdout
		return New(c, env.Logger)
	}),
}
