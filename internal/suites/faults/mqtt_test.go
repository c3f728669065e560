package faults

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit/mqtttest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// TestMQTTOutage stops a throwaway Mosquitto (SIGTERM: it saves its
// sessions) under the relay binary for outageLength() while applications
// keep writing, then starts it again on the same port and data: nothing
// is lost at a subscriber (a QoS 1 subscription in a session that
// outlives the restart), per-key order holds, and no attempt is counted
// while the broker is unreachable (the sink reports a refused connection
// as not attempted), beyond the messages on the wire when it went away.
func TestMQTTOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.Mosquitto(t, "persistence true", "persistence_location "+t.TempDir()+"/",
		"max_queued_messages 0", "max_inflight_messages 0")
	sub := mqttSubscribe(t, srv.URL(), "orders")
	sinkURL := srv.URL() + "?" + url.Values{"reconnect_initial": {"100ms"}, "reconnect_max": {"500ms"}}.Encode()
	endpointOutage(t, sinkURL, srv.Stop, srv.Start, func(written []string) []delivery {
		// Everything the relay delivered has a PUBACK, so it is queued
		// for the subscriber; wait until the subscriber has every
		// message, or nothing new came for a minute (a 10-minute
		// outage's last messages are the tails of the keys with the
		// deepest backlog, and a loaded machine delivers them late).
		want := make(map[string]bool, len(written))
		for _, p := range written {
			want[p] = true
		}
		var got []delivery
		seen, n, grew := 0, -1, time.Now()
		eventually(t, drainBound(), 500*time.Millisecond, func() (bool, string) {
			got = mqttDeliveries(sub)
			for _, d := range got[seen:] {
				delete(want, d.Payload)
			}
			seen = len(got)
			if len(got) != n {
				n, grew = len(got), time.Now()
			}
			return len(want) == 0 || time.Since(grew) > time.Minute,
				fmt.Sprintf("%d messages not yet at the subscriber", len(want))
		})
		t.Logf("subscriber %s: its connections: %s", sub.ID, sub.History())
		if len(want) > 0 {
			t.Logf("subscriber %s: %d of %d messages missing after a minute without a delivery; mosquitto's lines about it:\n%s",
				sub.ID, len(want), len(written), srv.OutputLines(sub.ID))
		}
		return got
	})
}

// mqttSubscriber is a QoS 1 subscriber in a session that outlives its
// connections and the broker's restart (an hour's expiry), and sends no
// pings. With a 30 s keep alive, in two of three 10-minute runs the
// subscriber's connection dropped every 30 s of the drain (the cadence of
// paho's PINGRESP check, 8 drops in each), and each reconnect had
// Mosquitto resend what was not yet acknowledged (1,513 and 3,966
// duplicates). The broker's stop closes the connection, which paho sees
// without pings.
func mqttSubscribe(t *testing.T, brokerURL, filter string) *mqtttest.Subscriber {
	t.Helper()
	return mqtttest.Subscribe(t, brokerURL, filter, mqtttest.Options{SessionExpiry: 3600})
}

// mqttDeliveries are the messages sub received, as deliveries.
func mqttDeliveries(sub *mqtttest.Subscriber) []delivery {
	var out []delivery
	for _, p := range sub.All() {
		out = append(out, delivery{Topic: p.Topic, Payload: string(p.Payload),
			ID: mqtttest.UserProperty(p, wire.ID), Key: mqtttest.UserProperty(p, wire.Key)})
	}
	return out
}
