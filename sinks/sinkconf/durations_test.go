package sinkconf_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

func TestCheckDurations(t *testing.T) {
	t.Parallel()
	require.NoError(t, sinkconf.CheckDurations("amqp", sinkconf.Dur("dial_timeout", 0), sinkconf.Dur("keepalive", time.Minute).AtMost(time.Minute)))
	require.EqualError(t, sinkconf.CheckDurations("amqp", sinkconf.Dur("dial_timeout", time.Second), sinkconf.Dur("heartbeat", -time.Second), sinkconf.Dur("reconnect_max", -time.Minute)),
		"outbox: amqp: heartbeat: must not be negative, got -1s", "the first problem, named")
	require.EqualError(t, sinkconf.CheckDurations("mqtt", sinkconf.Dur("keepalive", 2*time.Minute).AtMost(time.Minute)),
		"outbox: mqtt: keepalive: at most 1m0s, got 2m0s")
}

func TestReconnect(t *testing.T) {
	t.Parallel()
	initial, largest := sinkconf.ReconnectDefaults(0, 0, 100*time.Millisecond, 10*time.Second)
	require.Equal(t, []time.Duration{100 * time.Millisecond, 10 * time.Second}, []time.Duration{initial, largest})
	initial, largest = sinkconf.ReconnectDefaults(time.Minute, 0, 100*time.Millisecond, 10*time.Second)
	require.Equal(t, []time.Duration{time.Minute, time.Minute}, []time.Duration{initial, largest}, "the default max is at least the initial delay")
	require.NoError(t, sinkconf.CheckReconnect("nats", time.Second, 0))
	require.NoError(t, sinkconf.CheckReconnect("nats", time.Second, time.Second))
	require.EqualError(t, sinkconf.CheckReconnect("nats", time.Second, time.Millisecond),
		"outbox: nats: reconnect_max: 1ms is less than reconnect_initial 1s")
}
