package mqttsink

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	b := broker(t)
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true,
			Why: map[string]string{"Partitions": "an MQTT topic has no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t, b)
			return &sinktest.Env{
				Sink:  e.sink,
				Topic: e.topic,
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					ps, err := e.sub.read(ctx, n)
					out := make([]sinktest.Delivered, len(ps))
					for i, p := range ps {
						out[i] = delivered(p)
					}
					return out, err
				},
				// The broker's ACL denies the topic: PUBACK 0x87.
				Poison: func(topic string) sinks.Message {
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": deniedPrefix}
					return m
				},
				// The proxy refuses connections: the broker is unreachable.
				BreakTransient: e.proxy.Break,
				// The sink's connection is cut (through the proxy).
				Restart: e.proxy.Restart,
			}
		},
	})
}
